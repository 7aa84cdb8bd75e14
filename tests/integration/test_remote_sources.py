"""Users' data where users keep it (issue 32 item 7) and in the layouts upstream tools write (issue 32 item 1):
every source type, local and in a bucket (the moto S3 and fake-gcs servers on 127.0.0.1), prepared by
`prepare` with the right rows, text and speakers; rows whose paths leave the dataset folder are rejected there
too. The ljspeech and hf sources are the fixtures in tests/fixtures/data (scripts/data_fixtures.py: LJSpeech's
own metadata lines, folders written by HF `datasets`' save_to_disk with Common Voice's and Orpheus' columns)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.datasets import GOOD_ROWS, MAX_DURATION, make_folder_dataset, make_jsonl_dataset
from voxrelay import storage

FIXTURES = Path(__file__).parents[1] / "fixtures" / "data"
LJ = {  # id -> the normalized transcription (what the audio says)
    "LJ001-0001": "Printing, in the only sense with which we are at present concerned, differs from most if not from "
                  "all the arts and crafts represented in the Exhibition",
    "LJ001-0002": "in being comparatively modern.",
    "LJ001-0007": 'the earliest book printed with movable types, the Gutenberg, or "forty-two line Bible" of about '
                  "fourteen fifty-five,",
    "LJ001-0045": "fourteen sixty-nine, fourteen seventy;",
}


def _folder(tmp: Path) -> tuple[str, str, dict]:
    make_folder_dataset(tmp / "folder")
    rows = {r.id: (r.text, None) for r in GOOD_ROWS}
    return "folder", "{type: folder, path: %s}", rows


def _jsonl(tmp: Path) -> tuple[str, str, dict]:
    make_jsonl_dataset(tmp / "jsonl")
    rows = {f"j{i}": (f"Line {i}.", f"s{i % 2}") for i in range(3)}
    return "jsonl/data/train.jsonl", "{type: jsonl, path: %s}", rows


def _ljspeech(tmp: Path) -> tuple[str, str, dict]:
    return _copy(FIXTURES / "ljspeech", tmp / "ljspeech"), "{type: ljspeech, path: %s}", {k: (v, None) for k, v in
                                                                                        LJ.items()}


def _common_voice(tmp: Path) -> tuple[str, str, dict]:
    rows = {"common_voice_en_19001.mp3": ("The museum opens at nine.", "5e1c0a8f"),
            "common_voice_en_19002.mp3": ("Bring the blue umbrella with you.", "9b77d2c4"),
            "common_voice_en_19003.mp3": ("Rain is expected after lunch.", "5e1c0a8f")}
    return (_copy(FIXTURES / "hf_common_voice", tmp / "cv"),
            "{type: hf, path: %s, text_column: sentence, speaker_column: client_id, id_column: path}", rows)


def _orpheus(tmp: Path) -> tuple[str, str, dict]:
    rows = {"train-0": ("Hey there, I'm Tara. <laughs> Nice to finally meet you.", "tara"),
            "train-1": ("The train leaves at six, so don't be late.", "leo"),
            "train-2": ("Honestly, I think <sigh> we should start over.", "tara")}
    return _copy(FIXTURES / "hf_orpheus", tmp / "orpheus"), "{type: hf, path: %s, speaker_column: source}", rows


def _copy(src: Path, dst: Path) -> str:
    import shutil

    shutil.copytree(src, dst)
    return dst.name


SOURCES = {"folder": _folder, "jsonl": _jsonl, "ljspeech": _ljspeech, "hf-common-voice": _common_voice,
           "hf-orpheus": _orpheus}


@pytest.mark.parametrize("backend", ["local", "s3_root", "gcs_root"])
@pytest.mark.parametrize("source", list(SOURCES))
def test_every_source_prepares_from_local_and_bucket_paths(source, backend, request, tmp_path, monkeypatch):
    from voxrelay.config import load_config
    from voxrelay.data.loader import PreparedDataset
    from voxrelay.data.prepare import prepare

    monkeypatch.setenv("VOXRELAY_CACHE", str(tmp_path / "cache"))
    raw = tmp_path / "raw"
    relative, template, expected = SOURCES[source](raw)
    base = str(raw) if backend == "local" else storage.join(request.getfixturevalue(backend), "raw")
    if backend != "local":  # the user's upload: the same files, under a prefix of the bucket
        for file in sorted(p for p in raw.rglob("*") if p.is_file()):
            storage.put_file(file, storage.join(base, file.relative_to(raw).as_posix()))
    cfg = load_config(None, [f"root={tmp_path / 'root'}", f"data.sources=[{template % storage.join(base, relative)}]",
                             "data.eval_size=1", f"data.max_duration={MAX_DURATION}", "data.max_reject_fraction=1",
                             "codec.num_codebooks=2", "codec.codebook_size=8"])
    report = prepare(cfg)
    rows = [r for split in ("train", "eval") for r in PreparedDataset.open(cfg.prepared_uri, split).rows]
    assert {r.id: (r.text, r.speaker) for r in rows} == expected, report.rejects
    assert all(r.duration > 0.25 and r.codes.shape[0] == 2 for r in rows)
    reasons = {r["id"]: r["reason"] for r in report.rejects}
    escaping = {"folder": ["bad-traversal", "bad-absolute"], "jsonl": ["j-escape"]}.get(source, [])
    for bad in escaping:  # a name that leaves the dataset folder is refused, in a bucket as on a disk
        assert "outside the dataset folder" in reasons[bad] or "is absolute" in reasons[bad], reasons[bad]
    assert not set(reasons) & set(expected)
    if source == "folder":
        assert "audio file missing" in reasons["bad-missing-audio"] and "text file missing" in reasons[
            "bad-missing-text"]


def test_a_missing_bucket_source_is_named_whole(s3_root, tmp_path, monkeypatch):
    """`path: s3://my-bucket/raw/train.jsonl` was read as a local Path: "s3:/my-bucket/raw/train.jsonl: not found"."""
    from voxrelay.config import load_config
    from voxrelay.data.prepare import prepare
    from voxrelay.data.sources import SourceError

    monkeypatch.setenv("VOXRELAY_CACHE", str(tmp_path / "cache"))
    missing = storage.join(s3_root, "raw", "train.jsonl")
    cfg = load_config(None, [f"root={tmp_path / 'root'}", f"data.sources=[{{type: jsonl, path: {missing}}}]"])
    with pytest.raises(SourceError, match=f"^{missing}: not found; a jsonl source needs"):
        prepare(cfg)
