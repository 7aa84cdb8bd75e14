"""DacCodec over a tiny random-init DacModel saved with save_pretrained and loaded back by path."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import DacConfig, DacModel

from voxrelay.codecs.base import AudioCodec, CodecError
from voxrelay.codecs.dac import DacCodec

TINY = dict(
    encoder_hidden_size=8,
    downsampling_ratios=[2, 4],
    decoder_hidden_size=32,
    n_codebooks=3,
    codebook_size=16,
    codebook_dim=4,
    sampling_rate=16000,
)
HOP = 8


def save_tiny_dac(folder: Path) -> DacModel:
    torch.manual_seed(0)
    model = DacModel(DacConfig(**TINY)).eval()
    model.save_pretrained(folder)
    return model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[DacModel, DacCodec]:
    folder = tmp_path_factory.mktemp("dac")
    model = save_tiny_dac(folder)
    return model, DacCodec.from_pretrained(str(folder))


def tone(n: int) -> np.ndarray:
    t = np.arange(n) / 16000
    return (0.3 * np.sin(2 * np.pi * 330 * t) + 0.05 * np.sin(2 * np.pi * 2100 * t)).astype(np.float32)


def test_attributes_and_describe(tiny: tuple[DacModel, DacCodec]) -> None:
    _, codec = tiny
    assert isinstance(codec, AudioCodec)
    assert (codec.sample_rate, codec.num_codebooks, codec.codebook_size) == (16000, 3, 16)
    assert codec.frame_rate == 16000 / HOP
    desc = codec.describe()
    assert desc["type"] == "dac" and desc["hop_length"] == HOP
    assert json.loads(json.dumps(desc)) == desc
    assert not codec.model.training


@pytest.mark.parametrize("n", [800, 1003, 5])
def test_codes_shape_dtype_range(tiny: tuple[DacModel, DacCodec], n: int) -> None:
    _, codec = tiny
    codes = codec.encode(tone(n))
    assert codes.dtype == np.int64
    assert codes.shape == (3, -(-n // HOP))
    assert codes.min() >= 0 and codes.max() < 16


def test_codes_match_the_model_and_weights_survive_the_round_trip(tiny: tuple[DacModel, DacCodec]) -> None:
    model, codec = tiny
    wav = tone(800)
    with torch.inference_mode():
        expected = model.encode(torch.from_numpy(wav)[None, None]).audio_codes[0].numpy()
    np.testing.assert_array_equal(codec.encode(wav), expected)
    for key, value in model.state_dict().items():
        torch.testing.assert_close(codec.model.state_dict()[key], value, rtol=0, atol=0)


def test_decode_length_and_determinism(tiny: tuple[DacModel, DacCodec]) -> None:
    _, codec = tiny
    codes = codec.encode(tone(1000))
    a, b = codec.decode(codes), codec.decode(codes)
    assert a.dtype == np.float32 and a.shape == (codes.shape[1] * HOP,)
    np.testing.assert_array_equal(a, b)
    assert np.isfinite(a).all()


def test_decode_rejects_bad_codes(tiny: tuple[DacModel, DacCodec]) -> None:
    _, codec = tiny
    with pytest.raises(ValueError, match=r"\[3, T\]"):
        codec.decode(np.zeros((9, 4), dtype=np.int64))
    with pytest.raises(ValueError, match=r"\[0, 16\)"):
        codec.decode(np.full((3, 4), -1))


def test_missing_folder_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        DacCodec.from_pretrained(str(tmp_path / "no" / "such" / "dac"))


def test_a_folder_that_is_not_dac_is_a_user_error(tmp_path: Path) -> None:
    # transformers would otherwise build a random DAC from another model's config
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(CodecError, match="is not a DAC folder \\(config.json has model_type 'llama'\\)"):
        DacCodec.from_pretrained(str(tmp_path))
    (tmp_path / "config.json").unlink()
    with pytest.raises(CodecError, match="no config.json"):
        DacCodec.from_pretrained(str(tmp_path))


def test_a_dac_folder_without_weights_is_a_user_error(tmp_path: Path) -> None:
    save_tiny_dac(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(CodecError, match="as a local folder.*DacModel.save_pretrained"):
        DacCodec.from_pretrained(str(tmp_path))


def test_batched_encoding_matches_clip_by_clip_away_from_the_padding(tiny: tuple[DacModel, DacCodec]) -> None:
    """``encode_batch`` (what prepare uses with codec.batch_size > 1, on a GPU when there is one): the longest clip
    gets exactly its own codes; a shorter one its own codes except in its last frames, which see the batch's
    padding instead of its end (the receptive field of the encoder)."""
    _, codec = tiny
    rng = np.random.default_rng(0)
    clips = [rng.standard_normal(n).astype(np.float32) * 0.1 for n in (4000, 2500, 3000)]
    together = codec.encode_batch(clips)
    alone = [codec.encode(c) for c in clips]
    assert [c.shape for c in together] == [a.shape for a in alone]
    np.testing.assert_array_equal(together[0], alone[0])
    for t, a in zip(together[1:], alone[1:], strict=True):
        frames = a.shape[1]
        same = (t == a).all(axis=0)
        assert same[: frames // 2].all(), same  # the start of a shorter clip is unaffected


def test_a_dac_folder_in_a_bucket_is_fetched_once_into_the_cache(tiny, s3_root: str, tmp_path: Path, monkeypatch):
    """codec.path as `import parler-config` writes it for seed 000: a model folder in the bucket."""
    from voxrelay import storage

    monkeypatch.setenv("VOXRELAY_CACHE", str(tmp_path / "cache"))
    model, local = tiny
    folder = tmp_path / "saved"
    model.save_pretrained(folder)
    for path in folder.iterdir():
        storage.put_file(path, storage.join(s3_root, "dac", path.name))
    codec = DacCodec.from_pretrained(storage.join(s3_root, "dac"))
    wav = np.sin(np.arange(4 * HOP, dtype=np.float32))
    assert np.array_equal(codec.encode(wav), local.encode(wav))
    assert {p.name for p in (tmp_path / "cache").rglob("*") if p.is_file()} == {"config.json", "model.safetensors"}
