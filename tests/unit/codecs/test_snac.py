"""SnacCodec over a tiny random-init SNAC saved to a folder and loaded back by path."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from snac import SNAC

from voxrelay.codecs.base import AudioCodec, CodecError
from voxrelay.codecs.snac import SnacCodec

# FACTS.md: the smallest SNAC that works (attention off; with it, dims must be >= 64)
TINY = dict(
    sampling_rate=16000,
    encoder_dim=8,
    encoder_rates=[2, 2],
    decoder_dim=32,
    decoder_rates=[2, 2],
    attn_window_size=None,
    codebook_size=16,
    codebook_dim=4,
    vq_strides=[4, 2, 1],
)
HOP = 4  # prod(encoder_rates)


def save_tiny_snac(folder: Path, safetensors: bool = False, **overrides: object) -> SNAC:
    torch.manual_seed(0)
    params = {**TINY, **overrides}
    model = SNAC(**params).eval()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(params))
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if safetensors:
        save_file(state, folder / "model.safetensors")
    else:
        torch.save(state, folder / "pytorch_model.bin")
    return model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[SNAC, SnacCodec]:
    folder = tmp_path_factory.mktemp("snac")
    model = save_tiny_snac(folder)
    return model, SnacCodec.from_pretrained(str(folder))


def tone(n: int) -> np.ndarray:
    t = np.arange(n) / 16000
    return (0.3 * np.sin(2 * np.pi * 220 * t) + 0.1 * np.sin(2 * np.pi * 1250 * t)).astype(np.float32)


def test_loaded_weights_equal_the_saved_ones(tiny: tuple[SNAC, SnacCodec]) -> None:
    model, codec = tiny
    saved, loaded = model.state_dict(), codec.model.state_dict()
    assert saved.keys() == loaded.keys()
    for key in saved:
        torch.testing.assert_close(loaded[key], saved[key], rtol=0, atol=0)
    assert not codec.model.training


def test_attributes_and_describe(tiny: tuple[SNAC, SnacCodec]) -> None:
    _, codec = tiny
    assert isinstance(codec, AudioCodec)
    assert (codec.sample_rate, codec.num_codebooks, codec.codebook_size) == (16000, 7, 16)
    assert codec.frame_rate == 16000 / HOP / 4
    desc = codec.describe()
    assert desc["type"] == "snac" and desc["vq_strides"] == [4, 2, 1]
    assert json.loads(json.dumps(desc)) == desc  # goes into index.json


@pytest.mark.parametrize("n", [1000, 1600, 17])
def test_codes_grid_shape_dtype_range(tiny: tuple[SNAC, SnacCodec], n: int) -> None:
    _, codec = tiny
    codes = codec.encode(tone(n))
    assert codes.dtype == np.int64
    assert codes.shape == (7, -(-n // (HOP * 4)))  # ceil: the input is zero-padded to whole coarse frames
    assert codes.min() >= 0 and codes.max() < 16


def test_layout_is_codebook_major_with_sub_steps(tiny: tuple[SNAC, SnacCodec]) -> None:
    model, codec = tiny
    wav = tone(1600)
    raw = model.encode(torch.from_numpy(wav)[None, None])  # [1, T], [1, 2T], [1, 4T]
    grid = codec.encode(wav)
    t_coarse = grid.shape[1]
    np.testing.assert_array_equal(grid[0], raw[0][0].numpy())
    for t in range(t_coarse):
        np.testing.assert_array_equal(grid[1:3, t], raw[1][0, 2 * t : 2 * t + 2].numpy())
        np.testing.assert_array_equal(grid[3:7, t], raw[2][0, 4 * t : 4 * t + 4].numpy())
    # and split_codes is the exact inverse
    for ours, theirs in zip(codec.split_codes(grid), raw, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0)


def test_decode_is_deterministic_and_leaves_global_rng_alone(tiny: tuple[SNAC, SnacCodec]) -> None:
    _, codec = tiny
    codes = codec.encode(tone(1000))
    rng_before = torch.get_rng_state()
    a = codec.decode(codes)
    b = codec.decode(codes)
    assert torch.equal(rng_before, torch.get_rng_state())
    assert a.dtype == np.float32 and a.shape == (codes.shape[1] * 4 * HOP,)
    np.testing.assert_array_equal(a, b)
    assert np.isfinite(a).all() and np.abs(a).max() > 0


def test_decode_rejects_bad_codes(tiny: tuple[SNAC, SnacCodec]) -> None:
    _, codec = tiny
    with pytest.raises(ValueError, match=r"\[7, T\]"):
        codec.decode(np.zeros((3, 5), dtype=np.int64))
    with pytest.raises(ValueError, match=r"\[0, 16\)"):
        codec.decode(np.full((7, 5), 16))


def test_safetensors_folder_loads_too(tmp_path: Path) -> None:
    model = save_tiny_snac(tmp_path, safetensors=True)
    codec = SnacCodec.from_pretrained(str(tmp_path))
    wav = tone(800)
    reference = SnacCodec.from_model(model)
    np.testing.assert_array_equal(codec.encode(wav), reference.encode(wav))


def test_four_scale_model_gives_fifteen_rows(tmp_path: Path) -> None:
    save_tiny_snac(tmp_path, vq_strides=[8, 4, 2, 1])
    codec = SnacCodec.from_pretrained(str(tmp_path))
    codes = codec.encode(tone(3200))
    assert codes.shape == (15, 3200 // (HOP * 8))
    np.testing.assert_array_equal(codec.encode(codec.decode(codes)).shape, codes.shape)


def test_missing_folder_and_missing_weights_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        SnacCodec.from_pretrained(str(tmp_path / "nope"))
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    with pytest.raises(FileNotFoundError, match="pytorch_model.bin"):
        SnacCodec.from_pretrained(str(tmp_path))


def test_a_folder_of_another_model_is_a_user_error(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 8}))
    with pytest.raises(CodecError, match=r"not a SNAC config \(unknown fields \['hidden_size', 'model_type'\]\)"):
        SnacCodec.from_pretrained(str(tmp_path))
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(CodecError, match="config.json is not valid JSON"):
        SnacCodec.from_pretrained(str(tmp_path))
    (tmp_path / "config.json").unlink()
    with pytest.raises(CodecError, match=r"is not a SNAC folder \(no config.json\)"):
        SnacCodec.from_pretrained(str(tmp_path))


def test_weights_that_do_not_fit_the_config_are_a_user_error(tmp_path: Path) -> None:
    save_tiny_snac(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**TINY, "codebook_size": 32}))
    with pytest.raises(CodecError, match="do not fit its config.json"):
        SnacCodec.from_pretrained(str(tmp_path))


def test_strides_that_do_not_nest_are_rejected() -> None:
    fake = SimpleNamespace(
        vq_strides=[4, 3, 1], sampling_rate=16000, hop_length=4, codebook_size=16, eval=lambda: fake
    )
    with pytest.raises(ValueError, match=r"\[4, 3, 1\]"):
        SnacCodec.from_model(fake)  # type: ignore[arg-type]
