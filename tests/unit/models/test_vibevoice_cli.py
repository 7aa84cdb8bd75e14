"""The CLI on a run of seed 003's data (no speaker column: a model that clones each speaker from a voice prompt):
`voxrelay voices` says what the model takes and how to pass it; `synthesize` checks every --voice clip before
any model is loaded (the run's init_from is not even there: an error about it would mean the model came first)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.helpers.vibevoice_data import prepare_for_vibevoice, seed_003_corpus


@pytest.fixture
def run(tmp_path, monkeypatch) -> str:
    from voxrelay.config import load_config

    source = f"{{type: folder, path: {seed_003_corpus(tmp_path)}}}"
    prepare_for_vibevoice(tmp_path, monkeypatch, source)
    cfg = load_config(None, [f"root={tmp_path / 'root'}", f"data.sources=[{source}]", "codec.type=pcm",
                             "codec.sample_rate=24000", "model.family=vibevoice", "name=seed003",
                             f"model.init_from={tmp_path / 'not-needed-to-prepare'}"])
    folder = tmp_path / "root" / "runs" / "seed003"
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(cfg.to_yaml())
    return str(folder)


def _cli(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    from voxrelay.cli import main

    monkeypatch.setattr(sys, "argv", ["voxrelay", *args])
    with pytest.raises(SystemExit) as stop:
        main()
    captured = capsys.readouterr()
    return stop.value.code or 0, captured.out, captured.err


def test_voices_says_a_voice_prompt_model_takes_a_clip_per_speaker(run, monkeypatch, capsys):
    code, out, err = _cli(monkeypatch, capsys, "voices", run)
    assert code == 0 and out == "" and "single-speaker" not in err, err
    assert "voice prompt" in err and "--voice 0=" in err and "--voice 1=" in err and "[SPEAKER_A]" in err


@pytest.mark.parametrize(("voices", "named"), [
    (["0={tmp}/missing.wav"], "missing.wav"),
    (["0={tmp}/a.wav", "1={tmp}/not-audio.txt"], "not-audio.txt' cannot be read as audio"),
    (["0={tmp}/a.wav", "0={tmp}/a.wav"], "each speaker once"),
])
def test_synthesize_checks_every_voice_clip_before_loading_the_model(run, tmp_path, monkeypatch, capsys, voices,
                                                                      named):
    from tests.helpers.datasets import make_wav

    make_wav(tmp_path / "a.wav", 0.5, 24000)
    (tmp_path / "not-audio.txt").write_text("[SPEAKER_A] 你好。")
    args = [a for v in voices for a in ("--voice", v.format(tmp=tmp_path))]
    code, _, err = _cli(monkeypatch, capsys, "synthesize", run, "[SPEAKER_A] 你好。 [SPEAKER_B] 你好!", *args, "-o",
                        str(tmp_path / "out.wav"))
    assert code == 2 and named in err and "init_from" not in err and "Traceback" not in err, err
    assert not Path(tmp_path / "out.wav").exists()
