import numpy as np
import pytest

from tests.helpers.datasets import make_wav, sine, wav_bytes
from voxrelay.data.audio import (
    AUDIO_BYTES_KEY,
    load_audio,
    load_utterance_audio,
    resample,
    to_mono,
    trim_silence,
    write_wav,
)
from voxrelay.data.types import RowError, Utterance


def _utt(**kw) -> Utterance:
    return Utterance(id="u", text="hi", where="test row 2", **kw)


def test_load_audio_mono_and_stereo(tmp_path):
    wav, sr = load_audio(make_wav(tmp_path / "m.wav", 0.5, 16000))
    assert (wav.dtype, wav.shape, sr) == (np.float32, (8000,), 16000)
    wav, sr = load_audio(make_wav(tmp_path / "s.wav", 0.5, 22050, channels=2))
    assert wav.shape == (11025, 2) and sr == 22050
    assert to_mono(wav).shape == (11025,)


def test_resample_length_and_identity():
    x = sine(1.0, 16000)
    y = resample(x, 16000, 24000)
    assert y.dtype == np.float32 and abs(len(y) - 24000) <= 1
    assert np.array_equal(resample(x, 16000, 16000), x)
    with pytest.raises(ValueError, match="sample rates must be positive"):
        resample(x, 0, 16000)


def test_write_wav_roundtrip(tmp_path):
    p = write_wav(tmp_path / "sub" / "x.wav", sine(0.25, 8000), 8000)
    wav, sr = load_audio(p)
    assert sr == 8000 and wav.shape == (2000,)
    assert np.allclose(wav, sine(0.25, 8000), atol=1e-4)


def test_trim_silence_keeps_margin():
    x = np.concatenate([np.zeros(8000, np.float32), sine(0.5, 16000), np.zeros(8000, np.float32)])
    y = trim_silence(x, 16000, margin_s=0.05)
    assert 8000 + 2 * 800 - 20 <= len(y) <= 8000 + 2 * 800 + 1
    assert trim_silence(np.zeros(100, np.float32), 16000).shape == (100,)


def test_load_utterance_audio_from_path_resamples_to_mono(tmp_path):
    p = make_wav(tmp_path / "a.wav", 1.0, 22050, channels=2)
    wav = load_utterance_audio(_utt(audio_path=str(p)), 16000, 0.3, 20.0)
    assert wav.dtype == np.float32 and wav.ndim == 1 and abs(len(wav) - 16000) <= 1


def test_load_utterance_audio_from_array_and_bytes():
    wav = load_utterance_audio(_utt(audio=sine(1.0, 8000), sample_rate=8000), 16000, 0.3, 20.0)
    assert abs(len(wav) - 16000) <= 1
    wav = load_utterance_audio(_utt(extra={AUDIO_BYTES_KEY: wav_bytes(0.5, 16000)}), 16000, 0.3, 20.0)
    assert len(wav) == 8000


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda d: _utt(audio_path=str(d / "nope.wav")), "audio file missing"),
        (lambda d: _utt(audio_path=str(_write(d / "bad.wav", b"RIFFjunkWAVE"))), "unreadable or corrupt"),
        (lambda d: _utt(audio_path=str(make_wav(d / "n.wav", 1.0, nan=True))), "10 NaN/inf samples"),
        (lambda d: _utt(audio_path=str(make_wav(d / "e.wav", 0.0))), "no samples"),
        (lambda d: _utt(audio_path=str(make_wav(d / "s.wav", 0.1))), "too short: 0.10 s < data.min_duration 0.3 s"),
        (lambda d: _utt(audio_path=str(make_wav(d / "l.wav", 31.2))), "too long: 31.20 s > data.max_duration 20.0 s"),
        (lambda d: _utt(audio=np.array([0.1, np.inf], np.float32), sample_rate=8000), "NaN/inf"),
        (lambda d: _utt(audio=np.zeros(8000, np.float32)), "no valid sample_rate"),
        (lambda d: _utt(extra={AUDIO_BYTES_KEY: b"not audio at all"}), "unreadable audio bytes"),
        (lambda d: _utt(), "no audio"),
    ],
)
def test_load_utterance_audio_rejects_with_reason(tmp_path, make, reason):
    with pytest.raises(RowError) as err:
        load_utterance_audio(make(tmp_path), 16000, 0.3, 20.0)
    assert reason in str(err.value)


def _write(path, data: bytes):
    path.write_bytes(data)
    return path
