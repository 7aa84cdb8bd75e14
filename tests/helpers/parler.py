"""Tiny stand-ins of Parler-TTS' parts, built the way the real ones are (no download): a T5 tokenizer
(sentencepiece-style Unigram with T5's pad 0 / </s> 1 / <unk> 2, appending </s>), a tiny random
``T5EncoderModel`` over its vocabulary, and a tiny random transformers ``DacModel`` at 44.1 kHz with Parler's
9 codebooks of 1,024 codes and hop 512 (86 frames/s)."""

from __future__ import annotations

from pathlib import Path

import torch

TEXTS = ["A calm female voice with a clear, close-up recording.", "A man speaks quickly in a noisy room.",
         "The quick brown fox jumps over the lazy dog.", "Hello there, how are you doing today?",
         "A slightly expressive and animated speech, with a very clear audio quality."]
TINY_T5 = dict(d_model=24, d_kv=8, d_ff=48, num_layers=2, num_heads=2, feed_forward_proj="gated-gelu",
               relative_attention_num_buckets=8, relative_attention_max_distance=16, dropout_rate=0.0)
TINY_DAC = dict(encoder_hidden_size=4, downsampling_ratios=[2, 4, 8, 8], decoder_hidden_size=16,
                upsampling_ratios=[8, 8, 4, 2], n_codebooks=9, codebook_size=1024, codebook_dim=4, hidden_size=16,
                sampling_rate=44100, hop_length=512)


def save_t5_tokenizer(folder: Path) -> Path:
    """A T5-style tokenizer: Unigram pieces with the ▁ word prefix, ids 0/1/2 = <pad>/</s>/<unk>, </s> appended."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import T5TokenizerFast

    tok = Tokenizer(models.Unigram())
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.UnigramTrainer(vocab_size=160, special_tokens=["<pad>", "</s>", "<unk>"], unk_token="<unk>",
                                      show_progress=False)
    tok.train_from_iterator(TEXTS * 20 + [chr(c) for c in range(32, 127)], trainer)
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    fast = T5TokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>",
                           extra_ids=0)
    assert (fast.pad_token_id, fast.eos_token_id, fast.unk_token_id) == (0, 1, 2)
    fast.save_pretrained(str(folder))
    return folder


def save_tiny_t5(folder: Path, vocab_size: int, seed: int = 0) -> Path:
    from transformers import T5Config, T5EncoderModel

    torch.manual_seed(seed)
    T5EncoderModel(T5Config(vocab_size=vocab_size, **TINY_T5)).save_pretrained(str(folder))
    return folder


def save_tiny_dac(folder: Path, seed: int = 0) -> Path:
    from transformers import DacConfig, DacModel

    torch.manual_seed(seed)
    DacModel(DacConfig(**TINY_DAC)).eval().save_pretrained(str(folder))
    return folder


def save_parts(folder: Path) -> dict[str, Path]:
    """Tokenizer, T5 and DAC folders under ``folder``: the keys are the config keys that take them."""
    tok = save_t5_tokenizer(folder / "t5-tokenizer")
    from transformers import AutoTokenizer

    t5 = save_tiny_t5(folder / "t5", len(AutoTokenizer.from_pretrained(str(tok))))
    AutoTokenizer.from_pretrained(str(tok)).save_pretrained(str(t5))  # a T5 folder ships its tokenizer
    return {"text_encoder": t5, "prompt_tokenizer": tok, "dac": save_tiny_dac(folder / "dac")}


VOICES = {"en-us": "A man speaks with an American accent, in a clear and close recording.",
          "en-gb+f3": "A woman speaks with a British accent, slowly, in a quiet room."}


def make_parler_corpus(folder: Path, sentences: list[str]) -> dict[str, Path]:
    """Upstream Parler's data layout at tiny size: a ``save_to_disk`` speech dataset (id, audio with its bytes,
    text; each sentence spoken by every voice of :data:`VOICES`) and a metadata dataset of generated
    descriptions (id, text_description), joined on id by ``prepare``."""
    import io

    import soundfile as sf
    from datasets import Audio, Dataset

    from tests.helpers.speech import espeak

    ids, audio, texts, descriptions = [], [], [], []
    for i, text in enumerate(sentences):
        for voice, description in VOICES.items():
            wav, sr = espeak(text, voice)
            buf = io.BytesIO()
            sf.write(buf, wav, sr, format="WAV")
            ids.append(f"{voice}-{i:03d}")
            audio.append({"bytes": buf.getvalue(), "path": None})
            texts.append(text)
            descriptions.append(description)
    Dataset.from_dict({"id": ids, "audio": audio, "text": texts}).cast_column("audio", Audio()).save_to_disk(
        str(folder / "speech"))
    Dataset.from_dict({"id": ids[::-1], "text_description": descriptions[::-1]}).save_to_disk(str(folder / "meta"))
    return {"speech": folder / "speech", "meta": folder / "meta"}
