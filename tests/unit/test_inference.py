"""inference: arguments and folders that cannot work are refused before any model loads, as user errors."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from voxrelay.errors import UserError
from voxrelay.inference import check_export_output, check_synthesis_args, load_any


@pytest.mark.parametrize(
    ("out", "temperature", "match"),
    [
        ("speech.mp3", 0.8, r"'.*speech.mp3' is not a .wav file path; pass e.g. -o speech.wav"),
        ("speech", 0.8, "is not a .wav file path"),
        ("speech.wav", math.nan, "--temperature must be a finite number"),
        ("speech.wav", math.inf, "--temperature must be a finite number"),
    ],
)
def test_bad_synthesis_arguments(tmp_path: Path, out: str, temperature: float, match: str) -> None:
    with pytest.raises(UserError, match=match):
        check_synthesis_args(tmp_path / out, temperature)


def test_good_synthesis_arguments_pass(tmp_path: Path) -> None:
    check_synthesis_args(tmp_path / "a" / "speech.WAV", 0.0)  # greedy; a folder that does not exist yet is fine
    (tmp_path / "dir.wav").mkdir()
    with pytest.raises(UserError, match="dir.wav' is not a .wav file path"):
        check_synthesis_args(tmp_path / "dir.wav", 0.8)


def test_export_never_writes_into_a_foreign_folder(tmp_path: Path) -> None:
    assert check_export_output(tmp_path / "new") == tmp_path / "new"
    (tmp_path / "empty").mkdir()
    assert check_export_output(tmp_path / "empty") == tmp_path / "empty"
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("precious")
    with pytest.raises(UserError, match="holds other files and no previous export"):
        check_export_output(tmp_path / "mine")
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match="is a file"):
        check_export_output(tmp_path / "file")


def test_folders_that_are_neither_run_nor_export(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"is not a run folder \(no config.yaml\); pass <root>/runs/<name>"):
        load_any(str(tmp_path))
    (tmp_path / "codec.json").write_text("{}")  # looks like an export, but save_pretrained never finished
    with pytest.raises(UserError, match=r"not a complete export folder \(no voxrelay.json\)"):
        load_any(str(tmp_path))
    with pytest.raises(UserError, match="--step applies to run folders"):
        load_any(str(tmp_path), step=3)


def test_adapter_only_export_of_a_full_fine_tune_is_refused_before_loading(tmp_path: Path) -> None:
    from voxrelay.config import RunConfig
    from voxrelay.inference import export_run

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(RunConfig().to_yaml())  # no prepared data, no checkpoint: nothing loads
    with pytest.raises(UserError, match=r"--adapter-only applies to runs trained with train.lora; .* trained every "
                       "weight: export it without --adapter-only"):
        export_run(str(run), tmp_path / "out", adapter_only=True)


def test_an_export_is_never_mixed_with_one_of_the_other_kind(tmp_path: Path) -> None:
    full, adapter = tmp_path / "full", tmp_path / "adapter"
    full.mkdir()
    adapter.mkdir()
    (full / "voxrelay.json").write_text('{"family": "codec_lm"}')
    (adapter / "voxrelay.json").write_text('{"family": "codec_lm", "lora": {"base_hash": "x"}}')
    assert check_export_output(full, adapter_only=False) == full
    assert check_export_output(adapter, adapter_only=True) == adapter
    with pytest.raises(UserError, match="holds a full export; writing an adapter there would leave the old weights"):
        check_export_output(full, adapter_only=True)
    with pytest.raises(UserError, match="holds an adapter-only export; writing a merged model there"):
        check_export_output(adapter, adapter_only=False)


def test_a_voice_the_run_does_not_know_is_refused_before_the_model_loads(tmp_path: Path, monkeypatch, capsys) -> None:
    """A run of named voices (alice, bob): `--voice carol`, or two voices, is refused from the run's files alone
    (a user's walk: it came after 6 s of loading the model). The run has no checkpoint at all: an error about
    one would mean the model came first."""
    import json
    import sys

    from voxrelay.cli import main
    from voxrelay.config import load_config

    run = tmp_path / "root" / "runs" / "voices"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(load_config(None, [f"root={tmp_path / 'root'}", "name=voices"]).to_yaml())
    index = tmp_path / "root" / "prepared" / "demo" / "index.json"
    index.parent.mkdir(parents=True)
    index.write_text(json.dumps({"speakers": ["alice", "bob"]}))
    for voices, said in ((["carol"], "unknown voice 'carol'; this model knows: alice, bob"),
                         (["alice", "bob"], "speaks one voice at a time")):
        args = [a for v in voices for a in ("--voice", v)]
        monkeypatch.setattr(sys, "argv", ["voxrelay", "synthesize", str(run), "hello", *args, "-o",
                                          str(tmp_path / "out.wav")])
        with pytest.raises(SystemExit) as stop:
            main()
        err = capsys.readouterr().err
        assert stop.value.code == 2 and said in " ".join(err.split()) and "checkpoint" not in err, err


def test_a_model_folder_in_another_format_is_named_with_what_reads_it(tmp_path: Path) -> None:
    """An export written with --format parler (or a hub model) holds config.json and no voxrelay files: synthesize,
    eval, export and status say what it is and what voxrelay reads back, not only "no config.yaml"."""
    from voxrelay.monitor.status import StatusError, run_status

    (tmp_path / "config.json").write_text('{"model_type": "parler_tts"}')
    (tmp_path / "model.safetensors").write_bytes(b"")
    said = r"is a model folder in another format \(model_type 'parler_tts': an export with --format <upstream>"
    with pytest.raises(UserError, match=said + r".*--format voxrelay \(the default\).*pass <root>/runs/<name>"):
        load_any(str(tmp_path))
    with pytest.raises(StatusError, match=said):
        run_status(str(tmp_path))
    (tmp_path / "config.json").write_text("not json")
    with pytest.raises(UserError, match=r"another format \(config.json: an export"):
        load_any(str(tmp_path))
