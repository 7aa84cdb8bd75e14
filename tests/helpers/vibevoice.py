"""A tiny random ``VibeVoiceForConditionalGeneration`` checkpoint in transformers' layout, with a real Qwen2
tokenizer type (a byte-level BPE trained here, Qwen2's pre-tokenizer, VibeVoice's special tokens), built the
way a released one is loaded (no download): ``save_tiny_vibevoice(folder)`` -> ``model.init_from``.

The real sizes but the LM's: the σ-VAE hop 3200 at 24 kHz (7.5 latents/s), latent 64; a 2-layer Qwen2 of
width 64; a 1-layer diffusion head. The tiny σ-VAE's convolutions are He-initialised (the default init makes
its latents ~1e-12, so audio would not matter) and the latent factors set from its latents on a test signal.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

SPECIALS = ["<|endoftext|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>"]
SAMPLE_RATE = 24000


def _corpus() -> list[str]:
    from voxrelay.data.demo_text import SentenceMaker
    from voxrelay.models.vibevoice.examples import SYSTEM

    maker = SentenceMaker(np.random.default_rng(0))
    lines = [maker.sentence() for _ in range(300)]
    return [SYSTEM, " Voice input:\n Text input:\n Speech output:\n", *(f" Speaker {i % 2}: {t}\n"
                                                                       for i, t in enumerate(lines))]


def save_tokenizer(folder: Path, vocab_size: int = 600) -> None:
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import Qwen2Tokenizer
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    raw.train_from_iterator(_corpus(), trainer=trainer)
    import json

    model = json.loads(raw.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    tok = Qwen2Tokenizer(vocab=model["vocab"], merges=merges)
    tok.add_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS[1:]])
    assert tok.convert_tokens_to_ids(SPECIALS) == [0, 1, 2, 3]
    tok.save_pretrained(str(folder))


def tiny_config(vocab_size: int = 600, dropout: float = 0.1):
    from transformers import VibeVoiceConfig

    codec = {"downsampling_ratios": [2, 2, 4, 5, 5, 8], "depths": [0] * 7, "num_filters": 1, "kernel_size": 7,
             "vae_std": 0.06}
    text = {"model_type": "qwen2", "vocab_size": vocab_size, "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "max_position_embeddings": 4096, "tie_word_embeddings": True, "eos_token_id": 0, "pad_token_id": 0,
            "bos_token_id": None, "attention_dropout": dropout}
    return VibeVoiceConfig(
        text_config=text, audio_config={"model_type": "vibevoice_acoustic_tokenizer", "hidden_size": 64, **codec},
        semantic_model_config={"model_type": "vibevoice_acoustic_tokenizer_encoder", "hidden_size": 32, **codec},
        diffusion_head_config={"num_hidden_layers": 1, "intermediate_size": 128, "frequency_embedding_size": 64},
        pad_token_id=0, eos_token_id=0, audio_bos_token_id=1, audio_eos_token_id=2, audio_token_id=3)


def _he_init(net) -> None:
    for part in (net.model.audio_tower, net.model.semantic_tokenizer_encoder):
        for m in part.modules():
            if isinstance(m, torch.nn.Conv1d):
                fan = m.in_channels // m.groups * m.kernel_size[0]
            elif isinstance(m, torch.nn.ConvTranspose1d):
                fan = m.out_channels * m.kernel_size[0] // m.stride[0]
            else:
                continue
            torch.nn.init.normal_(m.weight, std=(2.0 / fan) ** 0.5)
            torch.nn.init.zeros_(m.bias)


def _test_signal(seconds: float = 4.0) -> torch.Tensor:
    t = torch.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    wav = 0.3 * torch.sin(2 * torch.pi * 150 * t) * (1 + 0.5 * torch.sin(2 * torch.pi * 3 * t))
    return wav + 0.01 * torch.randn(t.shape, generator=torch.Generator().manual_seed(0))


def save_tiny_vibevoice(folder: Path, seed: int = 0) -> Path:
    """Write the tiny checkpoint (config.json, model.safetensors, tokenizer) into ``folder``."""
    from transformers import VibeVoiceForConditionalGeneration

    folder.mkdir(parents=True, exist_ok=True)
    save_tokenizer(folder)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        net = VibeVoiceForConditionalGeneration(tiny_config())
        with torch.no_grad():
            _he_init(net)
            latents = net.model.audio_tower.encoder(_test_signal()[None, None]).latents
            net.model.latent_scaling_factor.fill_(1.0 / float(latents.std()))
            net.model.latent_bias_factor.fill_(-float(latents.mean()))
    net.save_pretrained(str(folder))
    return folder
