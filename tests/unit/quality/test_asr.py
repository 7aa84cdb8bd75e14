"""Whisper WER through faster-whisper with the packaged weights (installed by the dev extra):
clean eSpeak speech scores low, the same audio time-reversed (speech-like sound, no words) high;
packing puts each word back on its own utterance."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers.speech import SENTENCES, espeak
from voxrelay.quality.asr import (
    ASR_SAMPLE_RATE,
    AsrModelError,
    Transcriber,
    assign_words,
    pack,
    packaged_model,
    resolve_model,
    resolved,
)
from voxrelay.quality.text import errors, set_errors


def test_pack_keeps_order_gaps_and_the_window_limit():
    sr = ASR_SAMPLE_RATE
    clips = [np.ones(int(s * sr), dtype=np.float32) for s in (10.0, 10.0, 10.0, 30.0, 1.0)]
    windows = pack(clips, limit_s=28.0, gap_s=0.5)
    assert [w.members for w in windows] == [[0, 1], [2], [3], [4]]  # 10 + 0.5 + 10 <= 28 < 30.5 + 10
    assert windows[0].spans == [(0.0, 10.0), (10.5, 20.5)]
    assert len(windows[0].audio) == int(20.5 * sr)
    assert windows[0].audio[int(10.2 * sr)] == 0.0  # the gap is silence
    assert len(windows[2].audio) == 30 * sr  # a clip over the limit gets a window of its own


def test_words_go_to_the_nearest_utterance():
    spans = [(0.0, 2.0), (2.6, 5.0)]
    words = [(0.1, 0.5, " the"), (1.8, 2.25, " end"), (2.35, 2.7, " new"), (3.0, 3.4, " start"), (5.5, 5.9, " x")]
    assert assign_words(words, spans) == ["the end", "new start x"]


def test_packaged_weights_resolve_without_the_network():
    base = packaged_model("base")
    assert base is not None and (base / "model.bin").stat().st_size > 140e6
    assert resolve_model("auto") == str(base)
    assert resolve_model("tiny.en") == str(packaged_model("tiny.en"))
    assert resolve_model("large-v3") == "large-v3"  # a hub name faster-whisper fetches itself
    assert [resolved(n)[1] for n in ("auto", "tiny.en", "large-v3")] == ["base (packaged)", "tiny.en (packaged)",
                                                                         "large-v3"]  # what the scores say


def test_a_folder_without_a_model_is_a_clear_error(tmp_path):
    with pytest.raises(AsrModelError, match=r"neither CTranslate2's model\.bin nor a transformers config\.json"):
        resolve_model(str(tmp_path))


def save_transformers_whisper(folder: Path) -> Path:
    """A tiny random Whisper as transformers saves one (config.json, model.safetensors), with the real Whisper
    tokenizer (the packaged weights' tokenizer.json) and feature extractor settings."""
    from transformers import (
        WhisperConfig,
        WhisperFeatureExtractor,
        WhisperForConditionalGeneration,
        WhisperTokenizerFast,
    )

    torch.manual_seed(0)
    config = WhisperConfig(vocab_size=51865, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                           decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64,
                           decoder_start_token_id=50258, eos_token_id=50257, pad_token_id=50257, bos_token_id=50257)
    WhisperForConditionalGeneration(config).save_pretrained(folder)
    WhisperTokenizerFast(tokenizer_file=str(packaged_model("base") / "tokenizer.json")).save_pretrained(folder)
    WhisperFeatureExtractor().save_pretrained(folder)
    return folder


def test_a_transformers_whisper_is_converted_once_and_transcribes(tmp_path, monkeypatch):
    """eval.asr.model may name a Whisper in transformers' layout (what openai/whisper-large-v3 is): converted to
    CTranslate2 once into the cache, then loaded and decoded by faster-whisper as any other; the scores say so."""
    monkeypatch.setenv("VOXRELAY_CACHE", str(tmp_path / "cache"))
    folder = save_transformers_whisper(tmp_path / "whisper-hf")
    first, label = resolved(str(folder))
    assert (Path(first) / "model.bin").is_file() and Path(first).is_relative_to(tmp_path / "cache")
    assert label == f"{folder} (transformers, converted to CTranslate2)"
    made = (Path(first) / "model.bin").stat().st_mtime_ns
    assert resolved(str(folder))[0] == first and (Path(first) / "model.bin").stat().st_mtime_ns == made  # reused
    whisper = Transcriber.load(str(folder), "cpu", threads=1, beam_size=1)
    heard = whisper.transcribe([(np.zeros(16000, np.float32), 16000)])  # random weights: words, not sense
    assert len(heard) == 1 and isinstance(heard[0], str)
    assert whisper.describe("en").startswith(f"Whisper {folder} (transformers, converted to CTranslate2)")
    (folder / "model.safetensors").unlink()
    with pytest.raises(AsrModelError, match="could not be converted.*model.safetensors"):
        resolved(str(folder))


@pytest.fixture(scope="module")
def whisper():
    return Transcriber.load("auto", "cpu", threads=2)


@pytest.fixture(scope="module")
def clips():
    return [espeak(text, voice) for text, voice in zip(SENTENCES, ["en-us", "en-us+m3"] * 3, strict=True)]


def test_clean_speech_scores_low_and_reversed_speech_high(whisper, clips):
    clean = whisper.transcribe(clips)
    reversed_ = whisper.transcribe([(wav[::-1].copy(), sr) for wav, sr in clips])
    good, bad = set_errors(SENTENCES, clean), set_errors(SENTENCES, reversed_)
    print(f"clean WER {good.wer:.3f} CER {good.cer:.3f}; reversed WER {bad.wer:.3f} CER {bad.cer:.3f}")
    assert good.wer < 0.35 and good.cer < 0.2, clean
    assert bad.wer > 0.8 and bad.cer > 0.6, reversed_


def test_each_utterance_gets_its_own_words(whisper, clips):
    # shuffled order: the transcripts follow their clips
    order = [3, 0, 5, 1, 4, 2]
    hyps = whisper.transcribe([clips[i] for i in order])
    for i, hyp in zip(order, hyps, strict=True):
        others = [errors(SENTENCES[j], hyp).wer for j in range(len(SENTENCES)) if j != i]
        assert errors(SENTENCES[i], hyp).wer < min(others), (i, hyp)


def test_windows_decoded_in_batches_give_each_utterance_its_words(whisper, clips):
    # 12 clips fill more than one packed window; two windows go through the batched pipeline at once
    order = [3, 0, 5, 1, 4, 2, 2, 4, 0, 3, 1, 5]
    audio = [clips[i] for i in order]
    assert len(pack([np.zeros(int(len(w) / sr * ASR_SAMPLE_RATE)) for w, sr in audio])) >= 2
    batched = Transcriber(whisper.model, whisper.name, batch_size=2)
    hyps = batched.transcribe(audio)
    for i, hyp in zip(order, hyps, strict=True):
        others = [errors(SENTENCES[j], hyp).wer for j in range(len(SENTENCES)) if j != i]
        assert errors(SENTENCES[i], hyp).wer < min(others), (i, hyp)
    assert set_errors([SENTENCES[i] for i in order], hyps).wer < 0.25, hyps
    from voxrelay.quality.config import EvalConfig

    assert EvalConfig().asr.batch_size is None and whisper.batch_size == 1  # auto on a CPU: one window at a time


def test_beam_search_hears_clean_speech_better_than_greedy(whisper, clips):
    # the default (Whisper's own beam of 5) against eval.asr.beam_size=1 on the same packed window
    greedy = Transcriber(whisper.model, whisper.name, beam_size=1).transcribe(clips)
    beam = whisper.transcribe(clips)
    g, b = set_errors(SENTENCES, greedy), set_errors(SENTENCES, beam)
    print(f"greedy WER {g.wer:.3f} CER {g.cer:.3f}; beam 5 WER {b.wer:.3f} CER {b.cer:.3f}")
    assert whisper.beam_size == 5 and b.wer < g.wer, (greedy, beam)


def test_beam_size_is_validated():
    from pydantic import ValidationError

    from voxrelay.quality.config import EvalConfig

    assert EvalConfig().asr.beam_size == 5
    with pytest.raises(ValidationError, match="beam_size"):
        EvalConfig(asr={"beam_size": 0})


def test_the_yardstick_names_the_model_its_decoding_and_the_normaliser(whisper):
    assert whisper.describe("en") == ("Whisper base (packaged) (faster-whisper, beam 5), language en, "
                                      "Whisper's English normaliser without its spelling map")
    assert whisper.describe("zh").endswith("language zh, Whisper's basic normaliser")
