"""XCodec2 / NeuCodec encoder inputs computed without torchaudio == what transformers' extractors computed with
torchaudio's own kaldi.py (tests/fixtures/xcodec_features_golden.json, made by scripts/xcodec_features_golden.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from scripts.xcodec_features_golden import signal
from tests.helpers.codecs_tiny import tiny_neucodec
from voxrelay.codecs import xcodec_features as features
from voxrelay.codecs.neucodec import NeuCodecCodec

GOLDEN = json.loads((Path(__file__).parents[2] / "fixtures" / "xcodec_features_golden.json").read_text())
CASES = [(e["extractor"], c) for e in GOLDEN["extractors"] for c in e["cases"]]
CENTERED = {"Xcodec2FeatureExtractor": True, "NeuCodecFeatureExtractor": False}


@pytest.mark.parametrize(("extractor", "case"), CASES, ids=[f"{e}-{c['samples']}" for e, c in CASES])
def test_inputs_equal_the_extractors(extractor: str, case: dict) -> None:
    acoustic = features.acoustic_input(signal(case["samples"]))
    if "error" in case:  # NeuCodec's extractor refuses < 320 samples (kaldi needs one 400-sample window)
        assert not CENTERED[extractor] and case["samples"] < features.HOP
        with pytest.raises(ValueError, match="at least 400 samples"):
            features.semantic_input(acoustic, centered=False)
        return
    assert acoustic.shape == (1, 1, case["input_values"])
    expected = torch.tensor(np.asarray(case["input_features"], dtype=np.float32))
    semantic = features.semantic_input(acoustic, CENTERED[extractor])
    assert semantic.shape == (1, *expected.shape)
    # float32 sums in another order: ~1 ulp with 2 threads, 4.3e-6 with 1 (the suite runs one thread per process)
    torch.testing.assert_close(semantic[0], expected, rtol=0, atol=1e-5)
    assert case["input_features_mask"] == [1] * expected.shape[0]


def test_acoustic_input_appends_a_zero_then_pads_to_the_hop() -> None:
    wav = np.ones(640, dtype=np.float32)
    x = features.acoustic_input(wav)
    assert x.shape == (1, 1, 960) and x[0, 0, :640].eq(1).all() and x[0, 0, 640:].eq(0).all()


def test_fbank_needs_one_window() -> None:
    assert features.kaldi_fbank(torch.zeros(400)).shape == (1, 80)
    assert features.kaldi_fbank(torch.zeros(400 + 3 * 160 + 159)).shape == (4, 80)
    with pytest.raises(ValueError, match="at least 400 samples, got 399"):
        features.kaldi_fbank(torch.zeros(399))


def test_neucodec_takes_24_khz_and_codes_16_khz() -> None:
    """``encode`` resamples 24 kHz to the encoder's 16 kHz; ``encode_native`` takes 16 kHz as it is; a clip under
    20 ms (which the extractor refuses) is padded to one code."""
    codec = NeuCodecCodec.from_model(tiny_neucodec())
    assert (codec.sample_rate, codec.encoder_sample_rate, codec.hop_length, codec.encoder_hop_length) == (
        24000, 16000, 480, 320)
    desc = codec.describe()
    assert (desc["encoder_sample_rate"], desc["encoder_hop_length"]) == (16000, 320)
    import soxr

    wav24 = signal(4800) * 0.5
    wav16 = soxr.resample(wav24, 24000, 16000, quality="HQ").astype(np.float32)
    np.testing.assert_array_equal(codec.encode(wav24), codec.encode_native(wav16))
    assert codec.encode_native(signal(3200)).shape == (1, 10)  # N16 // 320: one code fewer than XCodec2's
    short = codec.encode_native(signal(100))
    np.testing.assert_array_equal(short, codec.encode_native(np.pad(signal(100), (0, 220))))
    assert short.shape == (1, 1)
