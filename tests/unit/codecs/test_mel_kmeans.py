"""MelKMeansCodec: shapes, fitting, state round trip, deterministic decode, reconstruction quality."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from voxrelay.codecs import dsp
from voxrelay.codecs.base import AudioCodec, FittableCodec
from voxrelay.codecs.mel_kmeans import MelKMeansCodec
from voxrelay.config import CodecConfig
from voxrelay.errors import ConfigError
from voxrelay.quality.mcd import mcd_dtw

SR = 16000
SMALL = dict(num_codebooks=2, codebook_size=64, griffin_lim_iters=16)


def voiced(seconds: float, seed: int) -> np.ndarray:
    """Speech-like test audio: harmonics of a wobbling f0 under a syllable-rate envelope, float32 [N]."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * SR)) / SR
    f0 = rng.uniform(100, 220) * (1 + 0.3 * np.sin(2 * np.pi * rng.uniform(0.5, 2) * t + rng.uniform(0, 6)))
    phase = 2 * np.pi * np.cumsum(f0) / SR
    amps = rng.uniform(0.2, 1.0, size=20)
    harmonics = sum(np.sin(k * phase) * amps[k - 1] / k for k in range(1, 21))
    envelope = 0.55 + 0.45 * np.sin(2 * np.pi * rng.uniform(2, 5) * t)
    return (0.1 * harmonics * envelope + 0.003 * rng.standard_normal(t.size)).astype(np.float32)


def chirp(seconds: float, f_start: float, f_end: float) -> np.ndarray:
    t = np.arange(int(seconds * SR)) / SR
    freq = f_start + (f_end - f_start) * t / seconds
    noise = 0.003 * np.random.default_rng(int(f_start)).standard_normal(t.size)
    return (0.3 * np.sin(2 * np.pi * np.cumsum(freq) / SR) + noise).astype(np.float32)


def training_clips() -> list[np.ndarray]:
    return [voiced(1.5, s) for s in range(30)] + [chirp(1.0, 200, 3000), chirp(1.0, 3000, 300)]


@pytest.fixture(scope="module")
def fitted() -> MelKMeansCodec:
    codec = MelKMeansCodec(**SMALL)
    codec.fit(training_clips(), seed=0)
    return codec


def test_protocols_and_describe() -> None:
    codec = MelKMeansCodec.from_config(CodecConfig(n_mels=64, codebook_size=128))
    assert isinstance(codec, FittableCodec) and isinstance(codec, AudioCodec)
    assert codec.describe() == {
        "type": "mel_kmeans",
        "sample_rate": 16000,
        "n_fft": 1024,
        "hop_length": 256,
        "n_mels": 64,
        "num_codebooks": 4,
        "codebook_size": 128,
        "fit_max_frames": 200_000,
        "griffin_lim_iters": 32,
    }
    assert codec.frame_rate == 62.5
    assert not codec.is_fitted


def test_encode_before_fit_is_a_clear_error() -> None:
    codec = MelKMeansCodec(**SMALL)
    with pytest.raises(RuntimeError, match="not fitted"):
        codec.encode(voiced(0.5, 0))
    with pytest.raises(RuntimeError, match="not fitted"):
        codec.state_bytes()


def test_codes_shape_dtype_and_range(fitted: MelKMeansCodec) -> None:
    wav = voiced(1.3, 99)
    codes = fitted.encode(wav)
    assert codes.dtype == np.int64
    assert codes.shape == (2, 1 + wav.size // 256)
    assert codes.min() >= 0 and codes.max() < 64
    # a real signal uses many centroids, not one
    assert len(np.unique(codes[0])) > 5


def test_fit_is_deterministic_per_seed() -> None:
    clips = training_clips()[:6]
    a, b, c = (MelKMeansCodec(**SMALL) for _ in range(3))
    a.fit(clips, seed=1)
    b.fit(clips, seed=1)
    c.fit(clips, seed=2)
    assert a.state_bytes() == b.state_bytes()
    assert a.state_bytes() != c.state_bytes()


def test_fit_max_frames_limits_the_sample() -> None:
    clips = training_clips()[:4]
    few = MelKMeansCodec(**{**SMALL, "codebook_size": 8, "fit_max_frames": 40})
    few.fit(clips, seed=0)
    # with 40 frames sampled, every centroid is a mean of sampled frames: the fitted codec still works
    assert few.encode(clips[0]).max() < 8
    with pytest.raises(ConfigError, match="too few to fit codec.codebook_size=.* or lower codec.codebook_size"):
        MelKMeansCodec(**SMALL).fit([voiced(0.1, 0)], seed=0)


def test_state_round_trip_gives_identical_codes(fitted: MelKMeansCodec) -> None:
    wav = chirp(0.8, 400, 2500)
    restored = MelKMeansCodec(**{k: v for k, v in fitted.describe().items() if k != "type"})
    restored.load_state_bytes(fitted.state_bytes())
    assert restored.is_fitted
    np.testing.assert_array_equal(restored.encode(wav), fitted.encode(wav))


def test_load_state_of_other_shape_names_the_mismatch(fitted: MelKMeansCodec) -> None:
    other = MelKMeansCodec(num_codebooks=3, codebook_size=64)
    with pytest.raises(ValueError, match=r"\(2, 64, 80\).*\(3, 64, 80\)"):
        other.load_state_bytes(fitted.state_bytes())


def test_decode_is_deterministic_with_expected_length(fitted: MelKMeansCodec) -> None:
    codes = fitted.encode(voiced(1.0, 5))
    a, b = fitted.decode(codes), fitted.decode(codes)
    assert a.dtype == np.float32 and a.shape == ((codes.shape[1] - 1) * 256,)
    np.testing.assert_array_equal(a, b)
    assert np.abs(a).max() > 1e-3  # not silence


def test_decode_rejects_bad_codes(fitted: MelKMeansCodec) -> None:
    with pytest.raises(ValueError, match=r"\[0, 64\)"):
        fitted.decode(np.full((2, 10), 64))
    with pytest.raises(ValueError, match=r"\[2, T\]"):
        fitted.decode(np.zeros((3, 10), dtype=np.int64))


def test_more_stages_quantise_better() -> None:
    clips = training_clips()
    held_out = [voiced(1.0, s) for s in range(100, 104)]
    errors = []  # (in-sample, held-out) mean |log-mel error| for 1, 2 and 4 stages
    for stages in (1, 2, 4):
        codec = MelKMeansCodec(**{**SMALL, "num_codebooks": stages})
        codec.fit(clips, seed=0)
        errors.append(
            tuple(
                np.mean([np.abs(codec.codes_to_log_mel(codec.encode(w)) - codec.features(w).T).mean() for w in ws])
                for ws in (clips[:8], held_out)
            )
        )
    print("mean |log-mel error| (in-sample, held-out) for 1, 2, 4 stages:", np.round(errors, 3).tolist())
    assert errors[0][0] > errors[1][0] > errors[2][0]
    assert errors[2][0] < 0.8 * errors[0][0]
    assert errors[2][1] < 0.85 * errors[0][1]


@pytest.mark.parametrize("ref", [voiced(2.0, 123), chirp(1.5, 250, 2500)], ids=["voiced", "chirp"])
def test_reconstruction_is_far_better_than_noise(fitted: MelKMeansCodec, ref: np.ndarray) -> None:
    # ref is unseen during fit. With 2 x 64 centroids fitted on 47 s the codec scores about 15 dB
    # on the voiced clip (Griffin-Lim floor, i.e. unquantised mel, 8 dB; white noise 39 dB) and
    # 23 dB on the chirp (floor 12 dB, noise 54 dB): pure tones are the hard case for k-means.
    rebuilt = fitted.decode(fitted.encode(ref))
    noise = (0.05 * np.random.default_rng(0).standard_normal(ref.size)).astype(np.float32)
    mcd_codec = mcd_dtw(ref, rebuilt, SR)
    mcd_floor = mcd_dtw(ref, fitted.log_mel_to_wav(fitted.features(ref).T), SR)
    mcd_noise = mcd_dtw(ref, noise, SR)
    print(f"MCD-DTW codec {mcd_codec:.1f} dB, Griffin-Lim floor {mcd_floor:.1f} dB, noise {mcd_noise:.1f} dB")
    assert mcd_floor < mcd_codec < mcd_floor + 12.0
    assert mcd_noise > 2 * mcd_codec


def test_filterbank_is_a_bank_of_ordered_triangles() -> None:
    fb = dsp.mel_filterbank(16000, 1024, 80)
    assert fb.shape == (80, 513) and fb.dtype == np.float32
    assert (fb >= 0).all() and (fb.sum(1) > 0).all()
    peaks = fb.argmax(1)
    assert (np.diff(peaks) >= 0).all() and peaks[-1] > 480
    np.testing.assert_allclose(dsp.mel_to_hz(dsp.hz_to_mel(np.array([50.0, 999.0, 4000.0]))), [50, 999, 4000])
    with pytest.raises(ValueError, match="fmax"):
        dsp.mel_filterbank(16000, 1024, 80, fmax=9000)


def test_griffin_lim_is_seeded_and_recovers_the_magnitude() -> None:
    wav = torch.from_numpy(chirp(0.5, 300, 3000))
    mag = dsp.stft(wav, 512, 128).abs()
    a = dsp.griffin_lim(mag, 512, 128, n_iter=24)
    b = dsp.griffin_lim(mag, 512, 128, n_iter=24)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    rebuilt = dsp.stft(a, 512, 128).abs()
    spectral_error = ((rebuilt - mag).norm() / mag.norm()).item()
    assert spectral_error < 0.25, spectral_error
