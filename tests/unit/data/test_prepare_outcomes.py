"""What `prepare` says and leaves when it cannot prepare what it was given (issue 32 items 2 and 7): a prepare
that kept no row, or too few, exits 2 with the reasons counted and every reject in rejects.jsonl (default,
--strict, --verbose); a prepare whose sources are gone but whose data is committed exits 0 (the second session
of a notebook); `train` on data with no row it can use exits 2 with the counts and the fix.

`voxrelay` runs in this process (``voxrelay.cli.main``) where its exit code and terminal output are what is
tested; `train` runs in a child process (it starts accelerate)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from tests.helpers.datasets import make_wav
from tests.helpers.runner import CONFIG, env_for, voxrelay
from voxrelay.models.base import DataNeeds
from voxrelay.models.codec_lm.config import CodecLMConfig

SPEAKERS = "num_speakers is 2 but the transcript has 1 speaker(s)"


def _corpus(tmp_path: Path, n: int = 5, seconds: float = 0.8) -> Path:
    folder = tmp_path / "corpus"
    rows = []
    for i in range(n):
        make_wav(folder / "clips" / f"c{i}.wav", seconds, 16000, freq=200.0 + 40 * i)
        rows.append({"id": f"u{i}", "audio": f"clips/c{i}.wav", "text": f"Line {i}."})
    (folder / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder / "train.jsonl"


def _args(tmp_path: Path, source: Path, *extra: str) -> list[str]:
    return ["prepare", CONFIG, f"root={tmp_path / 'root'}", f"data.sources=[{{type: jsonl, path: {source}}}]",
            "data.eval_size=1", "codec.num_codebooks=2", "codec.codebook_size=8", *extra]


def _cli(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    """``voxrelay ARGS`` in this process -> (exit code, stdout, stderr)."""
    from voxrelay import cli

    monkeypatch.setattr(cli.OWN_LINES, "verbose", False)  # -v sets it (and the variable) for the process
    monkeypatch.setenv("VOXRELAY_VERBOSE", "0")
    monkeypatch.setattr(sys, "argv", ["voxrelay", *args])
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        cli.main()
    out, err = capsys.readouterr()
    return stop.value.code or 0, out, err


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("VOXRELAY_CACHE", str(tmp_path / "cache"))
    return tmp_path


def _rejects(tmp_path: Path) -> list[dict]:
    path = tmp_path / "root" / "prepared" / "demo" / "rejects.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _committed(tmp_path: Path) -> bool:
    return (tmp_path / "root" / "prepared" / "demo" / "index.json").exists()


def test_a_prepare_that_kept_no_row_exits_2_with_the_reasons_counted(env, monkeypatch, capsys):
    """The issue's case: every row refused by the family's check; prepare exited 0 with 0 rows."""
    monkeypatch.setattr(CodecLMConfig, "data_needs", lambda self: DataNeeds(row_check=lambda *_: SPEAKERS))
    code, out, err = _cli(monkeypatch, capsys, *_args(env, _corpus(env)))
    assert code == 2, out + err
    assert "Traceback" not in err
    assert "5 of 5 rows rejected" in err and f"5 × {SPEAKERS}" in err, err
    assert f"train.jsonl:3 u2: {SPEAKERS}" in err  # each row named, under its file and line
    assert [r["id"] for r in _rejects(env)] == [f"u{i}" for i in range(5)]
    assert not _committed(env)  # `train` does not start on it


@pytest.mark.parametrize("flags", [[], ["--strict"], ["-v"]], ids=["default", "strict", "verbose"])
def test_a_source_whose_every_row_is_rejected_lists_them(env, monkeypatch, capsys, flags):
    """Every row rejected by the reader itself (audio outside the dataset folder): it once said "see rejects
    above" with nothing above and wrote no rejects.jsonl."""
    source = _corpus(env)
    source.write_text("".join(json.dumps({"id": f"u{i}", "audio": f"../../x{i}.wav", "text": "Hi."}) + "\n"
                              for i in range(4)))
    verbose = flags == ["-v"]
    code, out, err = _cli(monkeypatch, capsys, *(["-v"] if verbose else []),
                          *_args(env, source, *([] if verbose else flags)))
    assert code == 2, out + err
    assert "see rejects above" not in err
    rejects = _rejects(env)
    if flags == ["--strict"]:  # the first bad row stops it: that row, named, and in rejects.jsonl
        assert [r["id"] for r in rejects] == ["u0"] and "u0" in err and "u1" not in err
    else:
        assert [r["id"] for r in rejects] == ["u0", "u1", "u2", "u3"]
        assert "4 × path '../../x0.wav' is outside the dataset folder" in err, err  # counted as one reason
        for i in range(4):
            assert f"train.jsonl:{i + 1} u{i}: path '../../x{i}.wav' is outside the dataset folder" in err, err
    assert "outside the dataset folder" in rejects[0]["reason"]


def test_rows_the_codec_fit_cannot_read_are_listed(env, monkeypatch, capsys):
    """Every clip shorter than data.min_duration: the built-in codec has nothing to fit on; it once said
    "every row was rejected (see above)" with nothing above."""
    code, out, err = _cli(monkeypatch, capsys, *_args(env, _corpus(env), "data.min_duration=1.0"))
    assert code == 2, out + err
    assert "5 × too short" in err, err
    assert "train.jsonl:1 u0: too short: 0.80 s < data.min_duration 1.0 s" in err, err
    assert len(_rejects(env)) == 5 and not _committed(env)


def test_a_rejection_rate_above_the_threshold_stops_until_it_is_raised(env, monkeypatch, capsys):
    check = lambda text, n, speaker: SPEAKERS if text in ("Line 1.", "Line 3.") else None  # noqa: E731
    monkeypatch.setattr(CodecLMConfig, "data_needs", lambda self: DataNeeds(row_check=check))
    args = _args(env, _corpus(env))
    code, out, err = _cli(monkeypatch, capsys, *args)
    assert code == 2, out + err
    assert "2 of 5 rows rejected (40%)" in err and "data.max_reject_fraction=0.25" in err, err
    assert f"2 × {SPEAKERS}" in err
    assert [r["id"] for r in _rejects(env)] == ["u1", "u3"] and not _committed(env)
    # accepting the rate commits the same shards, encoded once
    code, out, err = _cli(monkeypatch, capsys, *args, "data.max_reject_fraction=0.5")
    assert code == 0, out + err
    assert "prepared 2 train + 1 eval utterances" in out and "shards written 0, reused 2" in out, out
    assert _committed(env) and len(_rejects(env)) == 2


def test_a_prepare_whose_sources_are_gone_keeps_the_committed_data(env, monkeypatch, capsys):
    """The second Colab session: the raw folder is not on the new runtime, the prepared data is in the bucket.
    The templates run `prepare` first in every session: it says so and exits 0; a changed parameter that
    would need the sources still stops."""
    source = _corpus(env)
    assert _cli(monkeypatch, capsys, *_args(env, source))[0] == 0
    index = (env / "root" / "prepared" / "demo" / "index.json").read_text()
    shutil.rmtree(source.parent)
    code, out, err = _cli(monkeypatch, capsys, *_args(env, source))
    assert code == 0, out + err
    assert f"{source}: not found" in out + err and "4 train + 1 eval" in out, out + err
    assert (env / "root" / "prepared" / "demo" / "index.json").read_text() == index  # untouched
    code, out, err = _cli(monkeypatch, capsys, *_args(env, source, "codec.num_codebooks=3"))
    assert code == 2 and "codec.num_codebooks 2 -> 3" in err and f"{source}: not found" in err, out + err


def test_train_on_data_without_a_usable_row_exits_2_with_the_counts(env, monkeypatch, capsys):
    """Every row longer than the model's longest sequence, and a committed dataset with no training row (as
    voxrelay wrote before prepare refused them): a message with the counts and the fix, not a traceback."""
    assert _cli(monkeypatch, capsys, *_args(env, _corpus(env)))[0] == 0
    train = ["train", CONFIG, *_args(env, env / "corpus" / "train.jsonl")[2:], "model.tokenizer=bytes",
             "model.hidden_size=16", "model.num_layers=1", "model.num_heads=2", "model.intermediate_size=32",
             "eval.asr=null", "eval.speaker_similarity=false"]
    environment = env_for(env / "cache", {"HF_HUB_OFFLINE": "1"})
    res = voxrelay(*train, "model.max_seq_len=8", env=environment, timeout=300)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stdout + res.stderr
    assert "none of the 4 training rows fits model.max_seq_len=8" in res.stderr, res.stderr
    assert "raise model.max_seq_len to at least" in res.stderr
    index_path = env / "root" / "prepared" / "demo" / "index.json"
    index = json.loads(index_path.read_text())
    index["counts"] = {"train": 0, "eval": 1, "rejected": 4}
    index["shards"] = [s for s in index["shards"] if s["split"] != "train"]
    index_path.write_text(json.dumps(index))
    res = voxrelay(*train, "name=empty", env=environment, timeout=300)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stdout + res.stderr
    assert "has no training rows (0 train, 1 eval, 4 rejected" in res.stderr, res.stderr
    assert "rejects.jsonl" in res.stderr and "voxrelay prepare" in res.stderr


def test_the_terminal_lists_the_first_rejects_and_counts_the_reasons():
    """45 rejects in a bucket source: 30 listed (paths relative to the source's folder, a URI), the rest counted;
    reasons that differ only in a value count as one."""
    from voxrelay.data.rejects import LISTED, format_rejects, stop_message

    rejects = [{"id": f"u{i}", "where": f"s3://b/raw/train.jsonl line {i + 1}",
                "reason": "empty text" if i % 3 else f"too short: 0.{i % 9}0 s < data.min_duration 1.0 s"}
               for i in range(45)]
    lines = format_rejects(rejects[::-1], "s3://b/root/prepared/x")  # listed in file order, as shards mix them
    assert format_rejects(rejects[:1], "s3://b/root/prepared/x")[0].startswith("1 rejected row (all in")
    assert lines[0] == "45 rejected rows (all in s3://b/root/prepared/x/rejects.jsonl); paths relative to s3://b/raw:"
    assert lines[1:LISTED + 1] == [f"  train.jsonl:{i + 1} u{i}: {r['reason']}" for i, r in enumerate(rejects[:LISTED])]
    assert lines[LISTED + 1:] == ["  ... and 15 more; the most common reasons:", "  30 × empty text",
                                  "  15 × too short: 0.00 s < data.min_duration 1.0 s (and 14 like it)"]
    message = stop_message("prepare kept no row: 45 of 45 rows rejected", rejects, "s3://b/root/prepared/x")
    assert message.splitlines()[:3] == ["prepare kept no row: 45 of 45 rows rejected. Most common reasons:",
                                        "  30 × empty text",
                                        "  15 × too short: 0.00 s < data.min_duration 1.0 s (and 14 like it)"]
    assert message.splitlines()[-1] == "  ... and 15 more"


def test_every_row_in_the_eval_split_says_so_without_an_empty_list_of_reasons():
    """A user's 12 clips with the recipe's data.eval_size 16: the message named no reasons under "Most common
    reasons:" (nothing was rejected)."""
    from voxrelay.data.rejects import gate, stop_message

    headline = gate({"train": 0, "eval": 12}, [], max_fraction=0.1, eval_size=16)
    assert headline == ("prepare kept no training row: the 12 usable rows all went to the eval split "
                        "(data.eval_size=16), and none was rejected; lower data.eval_size or add rows")
    assert stop_message(headline, [], "/r/prepared/x") == headline
    rejected = [{"id": "u1", "where": "/d/m.csv row 2", "reason": "empty text"}]
    assert "and 1 of 13 rows were rejected" in gate({"eval": 12}, rejected, max_fraction=0.1, eval_size=16)
