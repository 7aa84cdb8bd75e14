"""codec.type xcodec2 and neucodec over tiny random-init models saved with save_pretrained and loaded by path
through the registry (tests/helpers/codecs_tiny.py), as a released model is loaded."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.helpers.codecs_tiny import chirp, save_tiny_neucodec, save_tiny_xcodec2, tiny_neucodec, tiny_xcodec2
from voxrelay.codecs.base import AudioCodec, CodecError, CodecNotFoundError
from voxrelay.codecs.neucodec import NeuCodecCodec
from voxrelay.codecs.registry import build_codec, codec_from_description
from voxrelay.codecs.xcodec2 import Xcodec2Codec
from voxrelay.config import CodecConfig
from voxrelay.errors import UserError


@dataclass(frozen=True)
class Kind:
    name: str
    cls: type[Xcodec2Codec]
    save: Any
    make: Any
    rate: int  # of encode's input and decode's output
    hop: int  # samples per code at `rate`
    lengths: tuple[tuple[int, int], ...]  # (N samples at `rate`, T codes) as transformers' extractor pads


XCODEC2 = Kind("xcodec2", Xcodec2Codec, save_tiny_xcodec2, tiny_xcodec2, 16000, 320,
               ((1, 1), (319, 1), (320, 2), (641, 3), (3200, 11)))  # T = N // 320 + 1
NEUCODEC = Kind("neucodec", NeuCodecCodec, save_tiny_neucodec, tiny_neucodec, 24000, 480,
                ((1, 1), (479, 1), (480, 1), (959, 1), (960, 2), (4800, 10)))  # T = max(N // 480, 1)
KINDS = {k.name: k for k in (XCODEC2, NEUCODEC)}


@pytest.fixture(scope="module", params=list(KINDS))
def loaded(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Kind, AudioCodec]:
    kind = KINDS[request.param]
    folder = kind.save(tmp_path_factory.mktemp(kind.name))
    return kind, build_codec(CodecConfig(type=kind.name, path=str(folder)))


def test_the_registry_loads_it_with_the_released_layout(loaded: tuple[Kind, AudioCodec]) -> None:
    kind, codec = loaded
    assert isinstance(codec, kind.cls) and isinstance(codec, AudioCodec) and codec.name == kind.name
    assert (codec.sample_rate, codec.frame_rate, codec.num_codebooks, codec.codebook_size) == (kind.rate, 50.0, 1,
                                                                                                65536)
    assert codec.hop_length == kind.hop and not codec.model.training
    assert next(codec.model.parameters()).dtype == torch.float32


def test_codes_shape_dtype_range_and_count(loaded: tuple[Kind, AudioCodec]) -> None:
    kind, codec = loaded
    for n, frames in kind.lengths:
        codes = codec.encode(chirp(n, kind.rate))
        assert codes.dtype == np.int64 and codes.shape == (1, frames), (n, codes.shape)
        assert codes.min() >= 0 and codes.max() < 65536
    codes = codec.encode(chirp(kind.rate // 2, kind.rate))
    assert len(set(codes[0].tolist())) > codes.shape[1] // 2  # the tiny model's codes do spread


def test_encode_and_decode_are_deterministic_and_depend_on_the_audio(loaded: tuple[Kind, AudioCodec]) -> None:
    kind, codec = loaded
    wav = chirp(kind.rate // 4, kind.rate)
    codes = codec.encode(wav)
    np.testing.assert_array_equal(codec.encode(wav), codes)
    assert not np.array_equal(codec.encode(chirp(kind.rate // 4, kind.rate, seed=1)), codes)
    np.testing.assert_array_equal(codec.decode(codes), codec.decode(codes))


def test_decode_gives_hop_samples_per_code(loaded: tuple[Kind, AudioCodec]) -> None:
    kind, codec = loaded
    for frames in (1, 2, 7):
        codes = np.random.default_rng(frames).integers(0, 65536, size=(1, frames))
        wav = codec.decode(codes)
        assert wav.dtype == np.float32 and wav.shape == (frames * kind.hop,) and np.isfinite(wav).all()
    assert codec.decode(np.zeros((1, 0), dtype=np.int64)).shape == (0,)


def test_weights_survive_the_round_trip(loaded: tuple[Kind, AudioCodec]) -> None:
    kind, codec = loaded
    reference = kind.cls.from_model(kind.make())
    for key, value in reference.model.state_dict().items():
        torch.testing.assert_close(codec.model.state_dict()[key], value, rtol=0, atol=0)
    wav = chirp(kind.rate // 5, kind.rate)
    np.testing.assert_array_equal(codec.encode(wav), reference.encode(wav))


def test_the_description_rebuilds_the_same_codec(loaded: tuple[Kind, AudioCodec]) -> None:
    kind, codec = loaded
    desc = json.loads(json.dumps(codec.describe()))  # as index.json gives it back
    assert {k: desc[k] for k in ("type", "sample_rate", "frame_rate", "num_codebooks", "codebook_size",
                                 "hop_length")} == {"type": kind.name, "sample_rate": kind.rate, "frame_rate": 50.0,
                                                    "num_codebooks": 1, "codebook_size": 65536, "hop_length": kind.hop}
    rebuilt = codec_from_description(desc)
    assert isinstance(rebuilt, kind.cls) and rebuilt.describe() == desc
    wav = chirp(kind.rate // 5, kind.rate)
    np.testing.assert_array_equal(rebuilt.encode(wav), codec.encode(wav))
    for field, other in (("codebook_size", 1024), ("sample_rate", 44100), ("frame_rate", 75.0)):
        with pytest.raises(CodecError, match=f"no longer matches.*{field}"):
            codec_from_description({**desc, field: other})


def test_decode_rejects_bad_codes(loaded: tuple[Kind, AudioCodec]) -> None:
    kind, codec = loaded
    with pytest.raises(ValueError, match=rf"{kind.name}: codes must be int \[1, T\]"):
        codec.decode(np.zeros((2, 4), dtype=np.int64))
    with pytest.raises(ValueError, match=r"\[0, 65536\)"):
        codec.decode(np.full((1, 4), 65536))


@pytest.mark.parametrize("name", list(KINDS))
def test_a_missing_folder_names_the_path_and_the_fix(name: str, tmp_path: Path) -> None:
    missing = str(tmp_path / "no" / "such" / name)
    with pytest.raises(CodecNotFoundError, match=rf"codec folder '{missing}' does not exist; set codec.path") as info:
        build_codec(CodecConfig(type=name, path=missing))
    assert isinstance(info.value, UserError)  # the CLI's exit 2, no traceback
    with pytest.raises(UserError, match=rf"needs codec.path.*{KINDS[name].cls.source.example}"):
        build_codec(CodecConfig(type=name))


@pytest.mark.parametrize("name", list(KINDS))
def test_a_folder_of_another_codec_or_without_weights_is_a_user_error(name: str, tmp_path: Path) -> None:
    label = KINDS[name].cls.source.label
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "dac"}))
    with pytest.raises(CodecError, match=rf"is not a {label} folder \(config.json has model_type 'dac'\)"):
        build_codec(CodecConfig(type=name, path=str(tmp_path)))
    (tmp_path / "config.json").unlink()
    with pytest.raises(CodecError, match=rf"is not a {label} folder \(no config.json\)"):
        build_codec(CodecConfig(type=name, path=str(tmp_path)))
    KINDS[name].save(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(CodecError, match=rf"could not load {label} codec .* as a local folder"):
        build_codec(CodecConfig(type=name, path=str(tmp_path)))


def test_weights_that_miss_a_layer_are_refused_not_made_random(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    save_tiny_xcodec2(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    assert "semantic_encoder.masked_spec_embed" in state
    save_file({k: v for k, v in state.items() if k != "semantic_encoder.masked_spec_embed"},
              tmp_path / "model.safetensors", metadata={"format": "pt"})
    build_codec(CodecConfig(type="xcodec2", path=str(tmp_path)))  # SpecAugment's vector: training only
    save_file({k: v for k, v in state.items() if not k.startswith("quantizer.project_in")},
              tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CodecError, match=r"lacks weights \['quantizer.project_in.bias'"):
        build_codec(CodecConfig(type="xcodec2", path=str(tmp_path)))


def test_another_hop_is_refused(tmp_path: Path) -> None:
    from transformers import Xcodec2Config, Xcodec2Model

    from tests.helpers.codecs_tiny import TINY

    Xcodec2Model(Xcodec2Config(**{**TINY, "downsampling_ratios": [2, 2, 4, 4, 4]})).save_pretrained(tmp_path)
    with pytest.raises(CodecError, match="encodes 16000 Hz audio with hop 256.*16000 Hz and hop 320 only"):
        build_codec(CodecConfig(type="xcodec2", path=str(tmp_path)))
