"""build_codec / codec_from_description: every codec type, round trips, and the errors users will meet."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from snac import SNAC
from transformers import DacConfig, DacModel

from voxrelay.codecs.base import AudioCodec, FittableCodec
from voxrelay.codecs.dac import DacCodec
from voxrelay.codecs.mel_kmeans import MelKMeansCodec
from voxrelay.codecs.registry import build_codec, codec_from_description, codec_types
from voxrelay.config import CodecConfig
from voxrelay.errors import UserError

SR = 16000


def tone(seconds: float, freq: float = 200.0) -> np.ndarray:
    t = np.arange(int(seconds * SR)) / SR
    wav = sum(np.sin(2 * np.pi * k * freq * (1 + 0.1 * t) * t) / k for k in range(1, 8))
    return (0.1 * wav).astype(np.float32)


@pytest.fixture(scope="module")
def snac_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    folder = tmp_path_factory.mktemp("snac")
    params = dict(
        sampling_rate=SR, encoder_dim=8, encoder_rates=[2, 2], decoder_dim=32, decoder_rates=[2, 2],
        attn_window_size=None, codebook_size=16, codebook_dim=4, vq_strides=[4, 2, 1],
    )  # fmt: skip
    torch.manual_seed(0)
    (folder / "config.json").write_text(json.dumps(params))
    torch.save(SNAC(**params).state_dict(), folder / "pytorch_model.bin")
    return str(folder)


@pytest.fixture(scope="module")
def dac_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    folder = tmp_path_factory.mktemp("dac")
    torch.manual_seed(0)
    config = DacConfig(
        encoder_hidden_size=8, downsampling_ratios=[2, 4], decoder_hidden_size=32, n_codebooks=3,
        codebook_size=16, codebook_dim=4, sampling_rate=SR,
    )  # fmt: skip
    DacModel(config).save_pretrained(folder)
    return str(folder)


def test_codec_types() -> None:
    assert codec_types() == ["dac", "mel_kmeans", "mimi", "neucodec", "pcm", "snac", "vibevoice_latents", "xcodec2"]


def test_default_config_builds_an_unfitted_mel_kmeans() -> None:
    codec = build_codec(CodecConfig(n_mels=40, num_codebooks=2, codebook_size=8))
    assert isinstance(codec, MelKMeansCodec) and isinstance(codec, FittableCodec)
    assert not codec.is_fitted
    assert (codec.n_mels, codec.num_codebooks, codec.codebook_size) == (40, 2, 8)


def test_mel_kmeans_round_trips_through_its_description() -> None:
    codec = build_codec(CodecConfig(num_codebooks=2, codebook_size=16, griffin_lim_iters=4))
    assert isinstance(codec, MelKMeansCodec)
    codec.fit([tone(1.0, f) for f in (120, 180, 260)], seed=0)
    desc = json.loads(json.dumps(codec.describe()))  # as it comes back from index.json
    rebuilt = codec_from_description(desc, codec.state_bytes())
    wav = tone(0.7, 150)
    np.testing.assert_array_equal(rebuilt.encode(wav), codec.encode(wav))
    np.testing.assert_array_equal(rebuilt.decode(codec.encode(wav)), codec.decode(codec.encode(wav)))
    unfitted = codec_from_description(desc)
    assert isinstance(unfitted, MelKMeansCodec) and not unfitted.is_fitted


@pytest.mark.parametrize("kind", ["snac", "dac"])
def test_pretrained_codecs_need_a_path(kind: str) -> None:
    with pytest.raises(UserError, match="codec.path"):
        build_codec(CodecConfig(type=kind))


@pytest.mark.parametrize("kind", ["snac", "dac"])
def test_pretrained_codecs_build_and_round_trip(kind: str, snac_dir: str, dac_dir: str) -> None:
    path = snac_dir if kind == "snac" else dac_dir
    codec = build_codec(CodecConfig(type=kind, path=path))
    assert isinstance(codec, AudioCodec) and not isinstance(codec, FittableCodec)
    assert codec.name == kind
    rebuilt = codec_from_description(json.loads(json.dumps(codec.describe())))
    wav = tone(0.25)
    np.testing.assert_array_equal(rebuilt.encode(wav), codec.encode(wav))


def test_missing_folder_names_the_path(tmp_path: Path) -> None:
    missing = str(tmp_path / "absent")
    with pytest.raises(UserError, match="absent"):
        build_codec(CodecConfig(type="snac", path=missing))
    with pytest.raises(UserError, match="absent"):
        build_codec(CodecConfig(type="dac", path=missing))


def test_a_prepared_codec_that_is_gone_says_how_to_recover(tmp_path: Path) -> None:
    desc = {"type": "snac", "path": str(tmp_path / "gone"), "sample_rate": 24000}
    with pytest.raises(UserError, match=r"recorded in the prepared index.json.*prepare the data again"):
        codec_from_description(desc)


def test_changed_pretrained_codec_is_detected(dac_dir: str) -> None:
    desc = build_codec(CodecConfig(type="dac", path=dac_dir)).describe()
    with pytest.raises(ValueError, match="codebook_size"):
        codec_from_description({**desc, "codebook_size": 1024})


def test_bad_descriptions_are_clear_errors(dac_dir: str) -> None:
    with pytest.raises(ValueError, match="unknown codec type 'encodec'"):
        codec_from_description({"type": "encodec"})
    with pytest.raises(ValueError, match="n_fft"):
        codec_from_description({"type": "mel_kmeans", "sample_rate": 16000})
    wrapped = DacCodec.from_model(DacModel.from_pretrained(dac_dir)).describe()
    with pytest.raises(ValueError, match="no path"):
        codec_from_description(wrapped)
    with pytest.raises(ValueError, match="no fitted state"):
        codec_from_description({**wrapped, "path": dac_dir}, state=b"x")
