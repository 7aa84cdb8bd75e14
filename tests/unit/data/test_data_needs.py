"""prepare follows the model family's data needs (its config's ``data_needs()``): a text field every row
must carry (a row without it is rejected with that reason, or gets ``data.default_<field>``), recorded in
the data's identity; a codec the family cannot take is refused before anything is encoded."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.datasets import make_wav
from voxrelay.models.base import DataNeeds
from voxrelay.models.codec_lm.config import CodecLMConfig


def _corpus(tmp_path: Path) -> Path:
    folder = tmp_path / "corpus"
    rows = []
    for i in range(5):
        make_wav(folder / "clips" / f"c{i}.wav", 0.8, 16000, freq=200.0 + 40 * i)
        rows.append({"id": f"u{i}", "audio": f"clips/c{i}.wav", "text": f"Line {i}."}
                    | ({"description": f"voice {i}, calm"} if i != 3 else {}))
    (folder / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder / "train.jsonl"


def _prepare(tmp_path: Path, monkeypatch, needs: DataNeeds, *overrides: str):
    from voxrelay import storage
    from voxrelay.config import load_config
    from voxrelay.data.prepare import prepare

    monkeypatch.setenv("VOXRELAY_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(CodecLMConfig, "data_needs", lambda self: needs)
    cfg = load_config(None, [f"root={tmp_path / 'root'}", f"data.sources=[{{type: jsonl, path: {_corpus(tmp_path)}}}]",
                             "data.eval_size=1", "codec.num_codebooks=2", "codec.codebook_size=8", *overrides])
    report = prepare(cfg)
    return report, json.loads(storage.read_text(storage.join(cfg.prepared_uri, "index.json")))


def test_a_row_without_a_required_description_is_rejected_naming_the_fix(tmp_path, monkeypatch):
    report, index = _prepare(tmp_path, monkeypatch, DataNeeds(fields=("description",)))
    assert [r["id"] for r in report.rejects] == ["u3"]
    reason = report.rejects[0]["reason"]
    assert "no description" in reason and "data.default_description" in reason and "model.family=codec_lm" in reason
    assert index["counts"]["train"] + index["counts"]["eval"] == 4
    assert index["identity"]["params"]["data.required_fields"] == ["description"]


def test_a_configured_default_fills_the_missing_description(tmp_path, monkeypatch):
    from voxrelay.data.loader import PreparedDataset

    report, index = _prepare(tmp_path, monkeypatch, DataNeeds(fields=("description",)),
                             "data.default_description=a neutral voice")
    assert report.rejects == [] and index["counts"]["train"] + index["counts"]["eval"] == 5
    assert index["identity"]["params"]["data.default_description"] == "a neutral voice"
    prepared = str(tmp_path / "root" / "prepared" / "demo")
    rows = [r for split in ("train", "eval") for r in PreparedDataset.open(prepared, split, index).rows]
    by_id = {r.id: r.description for r in rows}
    assert by_id["u3"] == "a neutral voice" and by_id["u0"] == "voice 0, calm"


def test_without_needs_the_identity_is_unchanged(tmp_path, monkeypatch):
    _, index = _prepare(tmp_path, monkeypatch, DataNeeds())
    assert not any(k.startswith(("data.required", "data.default")) for k in index["identity"]["params"])


def test_a_codec_the_family_cannot_take_is_refused_before_encoding(tmp_path, monkeypatch):
    from voxrelay.data.shards import PrepareError

    with pytest.raises(PrepareError, match="needs codes of the snac codec, but codec.type=mel_kmeans"):
        _prepare(tmp_path, monkeypatch, DataNeeds(codec="snac"))
    assert not (tmp_path / "root" / "prepared" / "demo" / "index.json").exists()
    with pytest.raises(PrepareError, match="needs 7 codes per frame of 4096 values, but codec mel_kmeans gives 2 x 8"):
        _prepare(tmp_path, monkeypatch, DataNeeds(codes=(7, 4096)))


def test_a_family_that_needs_audio_gets_the_samples_at_its_rate(tmp_path, monkeypatch):
    """codec.type=pcm stores each row's audio as 16-bit samples at codec.sample_rate (the row's array is
    [1, N]); the eval split keeps no second copy as reference (decoding is the reference); a loaded row
    decodes to the source audio within 16-bit rounding."""
    import soundfile as sf

    from voxrelay.codecs.pcm import PcmCodec
    from voxrelay.data.loader import PreparedDataset

    _, index = _prepare(tmp_path, monkeypatch, DataNeeds(audio_rate=16000), "codec.type=pcm")
    assert index["codec"]["type"] == "pcm" and index["codec"]["sample_rate"] == 16000
    prepared = str(tmp_path / "root" / "prepared" / "demo")
    rows = {r.id: r for split in ("train", "eval") for r in PreparedDataset.open(prepared, split, index).rows}
    source, rate = sf.read(tmp_path / "corpus" / "clips" / "c2.wav", dtype="float32")
    assert rate == 16000 and rows["u2"].codes.shape == (1, len(source))
    assert abs(rows["u2"].duration - len(source) / rate) < 1e-6
    assert float(np.abs(PcmCodec(16000).decode(rows["u2"].codes) - source).max()) < 1.0 / 32767
    assert all(r.ref_audio is None for r in rows.values())


def test_audio_and_codes_families_refuse_the_other_kind_of_data(tmp_path, monkeypatch):
    from voxrelay.data.shards import PrepareError

    with pytest.raises(PrepareError, match=r"learns from the audio itself at 24000 Hz.*codec.type=pcm and "
                                           r"codec.sample_rate=24000"):
        _prepare(tmp_path, monkeypatch, DataNeeds(audio_rate=24000), "codec.type=pcm")
    with pytest.raises(PrepareError, match=r"learns discrete codes.*codec.type=pcm"):
        _prepare(tmp_path, monkeypatch, DataNeeds(), "codec.type=pcm")
    assert not (tmp_path / "root" / "prepared" / "demo" / "index.json").exists()


def test_a_row_the_family_refuses_is_rejected_with_its_reason(tmp_path, monkeypatch):
    def check(text, num_speakers, speaker):
        return "line 1 has no speaker label" if text == "Line 2." else None

    report, index = _prepare(tmp_path, monkeypatch, DataNeeds(row_check=check))
    assert [(r["id"], r["reason"]) for r in report.rejects] == [("u2", "line 1 has no speaker label")]
    assert index["counts"]["train"] + index["counts"]["eval"] == 4


def test_audio_longer_than_the_family_allows_is_rejected_naming_the_limit(tmp_path, monkeypatch):
    from voxrelay.data.shards import PrepareError

    needs = DataNeeds(max_seconds=0.5, max_seconds_why="model.max_length=4 allows at most 0.5 s; raise it")
    with pytest.raises(PrepareError, match=r"prepare kept no row: 5 of 5 rows rejected") as stop:  # every row
        _prepare(tmp_path, monkeypatch, needs)
    assert "5 × audio of 0.8 s is too long: model.max_length=4 allows at most 0.5 s" in str(stop.value)
    rejects = (tmp_path / "root" / "prepared" / "demo" / "rejects.jsonl").read_text().splitlines()
    assert len(rejects) == 5 and "model.max_length=4 allows at most 0.5 s" in rejects[0]
