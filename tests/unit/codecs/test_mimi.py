"""codec.type mimi over a tiny random-init MimiModel saved with save_pretrained and loaded by path through the
registry (tests/helpers/codecs_tiny.py), as kyutai/mimi is loaded: 24 kHz, 1920 samples per frame, 32 quantizers
of 2048 codes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers.codecs_tiny import chirp, save_tiny_mimi, tiny_mimi
from voxrelay.codecs.base import AudioCodec, CodecError, CodecNotFoundError
from voxrelay.codecs.mimi import MimiCodec
from voxrelay.codecs.registry import build_codec, codec_from_description
from voxrelay.config import CodecConfig, load_config
from voxrelay.data import identity
from voxrelay.data import shards as sh
from voxrelay.errors import UserError

RATE, HOP = 24000, 1920
# (N samples, T codes): T = ceil(N / 1920), the causal encoder padding the last partial frame itself
LENGTHS = ((1, 1), (1919, 1), (1920, 1), (1921, 2), (3840, 2), (3841, 3), (24000, 13))


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_mimi(tmp_path_factory.mktemp("mimi"))


@pytest.fixture(scope="module")
def codec(folder: Path) -> MimiCodec:
    built = build_codec(CodecConfig(type="mimi", path=str(folder)))
    assert isinstance(built, MimiCodec)
    return built


def test_the_config_keeps_csm_s_32_codebooks_unless_told_otherwise() -> None:
    assert CodecConfig(type="mimi").num_codebooks == 32
    assert CodecConfig(type="mimi", num_codebooks=8).num_codebooks == 8
    assert CodecConfig().num_codebooks == 4  # mel_kmeans' default is unchanged
    assert load_config(None, ["codec.type=mimi", "codec.path=kyutai/mimi"]).codec.num_codebooks == 32


def test_the_registry_loads_it_with_the_released_layout(codec: MimiCodec) -> None:
    assert isinstance(codec, AudioCodec) and codec.name == "mimi"
    assert (codec.sample_rate, codec.hop_length, codec.frame_rate) == (RATE, HOP, 12.5)
    assert (codec.num_codebooks, codec.codebook_size) == (32, 2048)
    assert not codec.model.training and next(codec.model.parameters()).dtype == torch.float32


def test_codes_shape_dtype_range_and_count(codec: MimiCodec) -> None:
    for n, frames in LENGTHS:
        codes = codec.encode(chirp(n, RATE))
        assert codes.dtype == np.int64 and codes.shape == (32, frames), (n, codes.shape)
        assert codes.min() >= 0 and codes.max() < 2048
    codes = codec.encode(chirp(2 * RATE, RATE))  # 25 frames
    assert len(set(codes[0].tolist())) > codes.shape[1] // 3  # the semantic codebook follows the audio
    assert len(np.unique(codes)) > 300 and codes.min() < 256 and codes.max() >= 1792  # spread over the codebook
    assert sh.stored_array(codes, codec).dtype == np.int16  # 2048 codes fit the shards' int16


def test_fewer_codebooks_are_the_first_quantizers(codec: MimiCodec, folder: Path) -> None:
    eight = build_codec(CodecConfig(type="mimi", path=str(folder), num_codebooks=8))
    assert eight.num_codebooks == 8 and eight.describe()["num_codebooks"] == 8
    wav = chirp(RATE, RATE)
    codes = eight.encode(wav)
    np.testing.assert_array_equal(codes, codec.encode(wav)[:8])
    assert eight.decode(codes).shape == (codes.shape[1] * HOP,)


def test_encode_and_decode_are_deterministic_and_depend_on_the_audio(codec: MimiCodec) -> None:
    wav = chirp(RATE // 2, RATE)
    codes = codec.encode(wav)
    np.testing.assert_array_equal(codec.encode(wav), codes)
    other = codec.encode(chirp(RATE // 2, RATE, seed=1))
    assert (other != codes).mean() > 0.5
    np.testing.assert_array_equal(codec.decode(codes), codec.decode(codes))


def test_decode_gives_1920_samples_per_frame(codec: MimiCodec) -> None:
    for frames in (1, 2, 7):
        codes = np.random.default_rng(frames).integers(0, 2048, size=(32, frames))
        wav = codec.decode(codes)
        assert wav.dtype == np.float32 and wav.shape == (frames * HOP,) and np.isfinite(wav).all()
    assert codec.decode(np.zeros((32, 0), dtype=np.int64)).shape == (0,)


def test_weights_survive_the_round_trip(codec: MimiCodec) -> None:
    reference = MimiCodec.from_model(tiny_mimi())
    for key, value in reference.model.state_dict().items():
        torch.testing.assert_close(codec.model.state_dict()[key], value, rtol=0, atol=0)
    wav = chirp(RATE // 3, RATE)
    np.testing.assert_array_equal(codec.encode(wav), reference.encode(wav))


def test_moving_it_drops_the_codebooks_cached_on_the_old_device(codec: MimiCodec) -> None:
    wav = chirp(RATE // 4, RATE)
    codes = codec.encode(wav)  # fills every codebook's cache
    assert codec.to("cpu") is codec
    cached = [m._embed for m in codec.model.modules() if type(m).__name__ == "MimiEuclideanCodebook"]
    assert len(cached) == 32 and all(c is None for c in cached)
    np.testing.assert_array_equal(codec.encode(wav), codes)


def test_the_description_rebuilds_the_same_codec(codec: MimiCodec, folder: Path) -> None:
    desc = json.loads(json.dumps(codec.describe()))  # as index.json gives it back
    assert desc == {"type": "mimi", "path": str(folder), "sample_rate": RATE, "frame_rate": 12.5,
                    "num_codebooks": 32, "codebook_size": 2048, "hop_length": HOP}
    rebuilt = codec_from_description(desc)
    assert isinstance(rebuilt, MimiCodec) and rebuilt.describe() == desc
    wav = chirp(RATE // 3, RATE)
    np.testing.assert_array_equal(rebuilt.encode(wav), codec.encode(wav))
    assert codec_from_description({**desc, "num_codebooks": 8}).num_codebooks == 8  # the codebooks it recorded
    for field, other in (("codebook_size", 1024), ("sample_rate", 16000), ("frame_rate", 25.0)):
        with pytest.raises(CodecError, match=f"no longer matches.*{field}"):
            codec_from_description({**desc, field: other})
    with pytest.raises(CodecError, match=r"lacks \['num_codebooks'\]"):
        codec_from_description({k: v for k, v in desc.items() if k != "num_codebooks"})
    with pytest.raises(CodecError, match="recorded in the prepared index.json.*codec.num_codebooks is 40"):
        codec_from_description({**desc, "num_codebooks": 40})


def test_prepared_data_of_other_codebooks_is_told_apart(codec: MimiCodec, folder: Path) -> None:
    overrides = ["codec.type=mimi", f"codec.path={folder}"]
    cfg = load_config(None, overrides)
    committed = identity.codec_params(cfg, codec) | {"data.min_duration": cfg.data.min_duration,
                                                      "data.max_duration": cfg.data.max_duration}
    assert identity.config_changes(cfg, committed) == []
    assert identity.config_changes(load_config(None, [*overrides, "codec.num_codebooks=8"]), committed) == [
        "codec.num_codebooks 32 -> 8"]


def test_decode_rejects_bad_codes(codec: MimiCodec) -> None:
    with pytest.raises(ValueError, match=r"mimi: codes must be int \[32, T\]"):
        codec.decode(np.zeros((8, 4), dtype=np.int64))
    with pytest.raises(ValueError, match=r"\[0, 2048\)"):
        codec.decode(np.full((32, 4), 2048))


def test_a_missing_folder_names_the_path_and_the_fix(tmp_path: Path) -> None:
    missing = str(tmp_path / "no" / "such" / "mimi")
    with pytest.raises(CodecNotFoundError, match=rf"Mimi codec folder '{missing}' does not exist; set codec.path "
                       r"to a local folder written by MimiModel.save_pretrained, or to a hub id such as "
                       r"'kyutai/mimi'") as info:
        build_codec(CodecConfig(type="mimi", path=missing))
    assert isinstance(info.value, UserError)  # the CLI's exit 2, no traceback
    with pytest.raises(UserError, match=r"codec.type 'mimi' needs codec.path.*codec.path=kyutai/mimi"):
        build_codec(CodecConfig(type="mimi"))


def test_a_folder_of_another_model_or_without_weights_is_a_user_error(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "csm"}))  # a CSM checkpoint: Mimi inside
    with pytest.raises(CodecError, match=r"is not a Mimi folder \(config.json has model_type 'csm'\); set "
                       r"codec.path to a folder written by MimiModel.save_pretrained \(model_type 'mimi'\)"):
        build_codec(CodecConfig(type="mimi", path=str(tmp_path)))
    (tmp_path / "config.json").unlink()
    with pytest.raises(CodecError, match=r"is not a Mimi folder \(no config.json\)"):
        build_codec(CodecConfig(type="mimi", path=str(tmp_path)))
    save_tiny_mimi(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(CodecError, match=r"could not load Mimi codec .* as a local folder"):
        build_codec(CodecConfig(type="mimi", path=str(tmp_path)))


def test_weights_that_miss_a_codebook_are_refused_not_made_random(folder: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    save_tiny_mimi(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    gone = "quantizer.acoustic_residual_vector_quantizer.layers.30.codebook.embed_sum"
    save_file({k: v for k, v in state.items() if k != gone}, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CodecError, match=r"lacks weights \[.*layers.30.codebook.embed_sum"):
        build_codec(CodecConfig(type="mimi", path=str(tmp_path)))


def test_more_codebooks_than_the_model_has_are_refused_naming_the_key(folder: Path) -> None:
    with pytest.raises(CodecError, match=r"codec.num_codebooks is 33, but the Mimi model '.*' has 32 quantizers.*"
                       r"set codec.num_codebooks between 1 and 32"):
        build_codec(CodecConfig(type="mimi", path=str(folder), num_codebooks=33))
    with pytest.raises(CodecError, match=r"codec.num_codebooks is 0.*between 1 and 32"):
        MimiCodec.from_model(tiny_mimi(), num_codebooks=0)
