import importlib.util

import numpy as np
import pytest
import torch

from voxrelay.data.audio import resample
from voxrelay.data.demo_corpus import SynthesisError, load_synthesizer
from voxrelay.quality import speaker
from voxrelay.quality.speaker import SpeakerEncoder, SpeakerEncoderMissing, cosine

SENTENCES = [
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "She sells sea shells by the sea shore every summer morning.",
]
# Measured with these two sentences: same voice 0.86-0.91, these two voices 0.59-0.62 (a female
# and a male variant; close male variants such as en-us vs en-gb+m3 are NOT separated, ~0.83).
VOICE_A, VOICE_B = "en-us+f3", "en-gb+m3"

# Top-12 coordinates of resemblyzer 0.1.4's embed_utterance(preprocess_wav(...)) on _buzz(): guards
# the front end (power mel, Slaney, volume, partials), which relative comparisons would not notice.
_REFERENCE = {
    202: 0.2377, 146: 0.1996, 213: 0.1934, 158: 0.1920, 218: 0.1904, 151: 0.1844,
    36: 0.1722, 101: 0.1571, 247: 0.1554, 178: 0.1546, 84: 0.1525, 246: 0.1471,
}  # fmt: skip


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    # Tiny LSTM batches: with 2 OpenMP threads on a busy 2-core host one embed took 7.6 s instead
    # of 33 ms (measured); one thread is as fast when the host is idle.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def encoder():
    try:
        return SpeakerEncoder.load()
    except SpeakerEncoderMissing as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def clips():
    """{(voice, sentence index): (float32 wav, sample rate)} from eSpeak NG."""
    try:
        synth = load_synthesizer()
    except SynthesisError as e:
        pytest.skip(str(e))
    out = {}
    for voice in (VOICE_A, VOICE_B):
        for i, text in enumerate(SENTENCES):
            wav, sr = synth.synth(text, voice, 165, 1)
            out[voice, i] = (wav.astype(np.float32) / 32768.0, sr)
    return out


def _buzz():
    """2.5 s of a vibrato buzz with 19 harmonics, amplitude-modulated, plus a little noise (16 kHz)."""
    sr = 16000
    t = np.arange(int(2.5 * sr)) / sr
    phase = 2 * np.pi * np.cumsum(140 + 20 * np.sin(2 * np.pi * 3 * t)) / sr
    wav = sum(np.sin(k * phase) / k for k in range(1, 20)) * (0.5 + 0.5 * np.sin(2 * np.pi * 4 * t) ** 2)
    wav += 0.01 * np.random.default_rng(0).standard_normal(len(t))
    return (0.1 * wav).astype(np.float32), sr


def test_matches_resemblyzer_reference_values(encoder):
    emb = encoder.embed(*_buzz())
    for index, value in _REFERENCE.items():
        assert emb[index] == pytest.approx(value, abs=2e-3), index


def test_embedding_is_unit_norm_float32_256(encoder, clips):
    emb = encoder.embed(*clips[VOICE_A, 0])
    assert emb.shape == (256,) and emb.dtype == np.float32
    assert np.linalg.norm(emb) == pytest.approx(1.0, abs=1e-5)
    assert (emb >= 0).all()  # ReLU before the norm


def test_same_voice_scores_higher_than_different_voices(encoder, clips):
    emb = {key: encoder.embed(*clip) for key, clip in clips.items()}
    same = [cosine(emb[v, 0], emb[v, 1]) for v in (VOICE_A, VOICE_B)]
    cross = [cosine(emb[VOICE_A, i], emb[VOICE_B, j]) for i in range(2) for j in range(2)]
    assert min(same) > 0.8, same
    assert max(cross) < 0.72, cross
    assert min(same) - max(cross) > 0.15


def test_sample_rate_is_resampled(encoder, clips):
    wav, sr = clips[VOICE_A, 0]
    at_24k = resample(wav, sr, 24_000)
    at_16k = resample(wav, sr, 16_000)
    assert cosine(encoder.embed(at_24k, 24_000), encoder.embed(at_16k, 16_000)) > 0.995
    # a wrong rate must change the embedding, or the test above proves nothing
    assert cosine(encoder.embed(at_24k, 16_000), encoder.embed(at_16k, 16_000)) < 0.97


def test_silence_padding_and_volume_barely_matter(encoder, clips):
    wav, sr = clips[VOICE_B, 0]
    ref = encoder.embed(wav, sr)
    pause = np.zeros(sr, np.float32)
    padded = np.concatenate([pause, wav, pause, pause, 0.2 * wav[: sr // 2], pause])
    assert cosine(encoder.embed(padded, sr), encoder.embed(np.concatenate([wav, 0.2 * wav[: sr // 2]]), sr)) > 0.99
    assert cosine(encoder.embed(np.concatenate([pause, wav, pause]), sr), ref) > 0.985
    # quiet input is raised to -30 dBFS, so the level below that does not matter (above it, it does:
    # a -20 dBFS clip and the same at -32 dBFS score ~0.91, in resemblyzer too)
    assert cosine(encoder.embed(0.05 * wav, sr), encoder.embed(0.01 * wav, sr)) > 0.9999


def test_trim_cuts_long_silences_and_keeps_speech(clips):
    wav, sr = clips[VOICE_A, 1]
    wav = speaker.normalize_volume(resample(wav, sr, speaker.SAMPLE_RATE))
    gap = np.zeros(2 * speaker.SAMPLE_RATE, np.float32)
    hiss = 3e-3 * np.random.default_rng(1).standard_normal(len(gap)).astype(np.float32)
    for filler in (gap, hiss):  # hiss at -50 dBFS: within 40 dB of the peak, above the noise floor
        trimmed = speaker.trim_long_silences(np.concatenate([filler, wav, filler, wav, filler]))
        assert 2 * len(wav) - 0.15 * speaker.SAMPLE_RATE < len(trimmed) < 2 * len(wav) + 0.8 * speaker.SAMPLE_RATE
    assert len(speaker.trim_long_silences(np.zeros(8000, np.float32))) == 7680  # nothing voiced: kept


def test_partial_slices():
    three_s = speaker.partial_slices(3 * speaker.SAMPLE_RATE)
    assert [(s.start, s.stop) for s in three_s] == [(0, 160), (77, 237), (154, 314)]
    assert len(speaker.partial_slices(8000)) == 1  # shorter than one partial: still one
    # a last partial covering < 75 % is dropped: 2.6 s has a 3rd partial at 1.54 s covering 66 %
    assert len(speaker.partial_slices(int(2.6 * speaker.SAMPLE_RATE))) == 2


def test_missing_weights_raise_install_hint(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(SpeakerEncoderMissing, match=r"install voxrelay\[eval\]") as info:
        SpeakerEncoder.load()
    assert isinstance(info.value, RuntimeError) and "\n" not in str(info.value)


def test_cosine():
    assert cosine([1, 0], [0, 2]) == 0.0
    assert cosine(np.array([1.0, 1.0]), np.array([2.0, 2.0])) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="zero vector"):
        cosine([0, 0], [1, 0])


def test_a_dialogue_is_scored_per_speaker_against_each_voice(encoder, clips):
    """Each speaker of a two-voice sample is scored against its own voice: a dialogue where both speak scores
    speaker 1 well above a "dialogue" where speaker 0 says everything (speaker 1's voice never heard)."""
    from voxrelay.quality.scorer import per_speaker

    rate = clips[VOICE_A, 0][1]
    a0, a1, b0, b1 = (clips[v, i][0] for v in (VOICE_A, VOICE_B) for i in (0, 1))
    voices = [a1, b0]  # each speaker's voice from a sentence other than the ones spoken
    both = per_speaker(encoder, np.concatenate([a0, b1]), rate, voices)
    only_a = per_speaker(encoder, np.concatenate([a0, a1]), rate, voices)
    assert set(both) == {0, 1}
    assert both[1] > only_a[1] + 0.1, (both, only_a)
    assert both[0] > both[1] - 0.15 and both[0] > only_a[1] + 0.1, (both, only_a)
