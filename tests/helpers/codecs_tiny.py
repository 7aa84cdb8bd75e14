"""Tiny random-init XCodec2 / NeuCodec / Mimi checkpoints in transformers' layout (``save_pretrained``), loaded the way
a released one is (``codec.type: xcodec2`` / ``neucodec`` / ``mimi`` with ``codec.path`` = the folder; no download).

The released rates and code layout (16 kHz in, hop 320, 50 Hz, one codebook of 4^8 = 65,536; NeuCodec decodes at
24 kHz, hop 480) with every width shrunk: a 1-layer w2v-BERT of width 16 as the semantic encoder, acoustic
encoder width 2 -> 64, a 1-layer decoder transformer of width 64 (GroupNorm's 32 groups need >= 64 channels for
a one-frame decode). About 0.2 M parameters; seeded, so two calls write the same weights.

transformers' init gives every frame the same code (43690: the values before the quantiser are ~1e-4 and all
round to the middle level), so the encoder side is re-initialised (LeCun normal; the acoustic encoder at half
that, as its Snake activations amplify) and two layers rescaled on a fixed chirp: the acoustic encoder's output
to std 1, the quantiser's input to std 1.5, so codes spread over the codebook and depend on both branches.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

SEMANTIC = dict(model_type="wav2vec2-bert", hidden_size=16, output_hidden_size=16, num_hidden_layers=1,
                num_attention_heads=2, intermediate_size=32, conv_depthwise_kernel_size=3,
                left_max_position_embeddings=8, right_max_position_embeddings=4)
TINY = dict(hidden_size=64, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
            head_dim=32, encoder_hidden_size=2, quantization_dim=64 + 16, semantic_model_config=SEMANTIC)


def chirp(samples: int, rate: int = 16000, seed: int = 0) -> np.ndarray:
    """float32 [samples]: a 200 Hz -> 2 kHz chirp with a little seeded noise, in (-0.5, 0.5)."""
    t = np.arange(samples) / rate
    noise = np.random.default_rng(seed).standard_normal(samples)
    return (0.3 * np.sin(2 * np.pi * (200 + 900 * t) * t) + 0.05 * noise).astype(np.float32)


def _lecun(module: torch.nn.Module, generator: torch.Generator, gain: float) -> None:
    for layer in module.modules():
        if isinstance(layer, (torch.nn.Conv1d, torch.nn.Linear)):
            layer.weight.normal_(0.0, gain / layer.weight[0].numel() ** 0.5, generator=generator)


@torch.no_grad()
def _spread(model, seed: int, centered: bool) -> None:
    """The re-initialisation of the module docstring, in place."""
    from voxrelay.codecs import xcodec_features as features

    generator = torch.Generator().manual_seed(seed)
    _lecun(model.acoustic_encoder, generator, 0.5)
    for part in (model.semantic_adapter, model.fc_encoder, model.quantizer.project_in):
        _lecun(part, generator, 1.0)
    acoustic = features.acoustic_input(chirp(3200))
    semantic = features.semantic_input(acoustic, centered)
    out = model.acoustic_encoder.conv2
    scale = 1.0 / model.acoustic_encoder(acoustic).std()
    out.weight.mul_(scale), out.bias.mul_(scale)
    quantizer_input = []
    hook = model.quantizer.project_in.register_forward_hook(lambda _m, _i, o: quantizer_input.append(o))
    model.encode(acoustic, input_features=semantic)
    hook.remove()
    scale = 1.5 / quantizer_input[0].std()
    model.quantizer.project_in.weight.mul_(scale), model.quantizer.project_in.bias.mul_(scale)


def tiny_xcodec2(seed: int = 0):
    """A random-init ``Xcodec2Model`` (eval mode) of the sizes above."""
    from transformers import Xcodec2Config, Xcodec2Model

    torch.manual_seed(seed)
    model = Xcodec2Model(Xcodec2Config(**TINY)).eval()
    _spread(model, seed, centered=True)
    return model


def tiny_neucodec(seed: int = 0):
    """A random-init ``NeuCodecModel`` (eval mode) of the sizes above."""
    from transformers import NeuCodecConfig, NeuCodecModel

    torch.manual_seed(seed)
    model = NeuCodecModel(NeuCodecConfig(**TINY)).eval()
    _spread(model, seed, centered=False)
    return model


def save_tiny_xcodec2(folder: Path | str, seed: int = 0) -> Path:
    """Write a tiny XCodec2 to ``folder`` (config.json + model.safetensors); returns the folder."""
    folder = Path(folder)
    tiny_xcodec2(seed).save_pretrained(folder)
    return folder


def save_tiny_neucodec(folder: Path | str, seed: int = 0) -> Path:
    """Write a tiny NeuCodec to ``folder`` (config.json + model.safetensors); returns the folder."""
    folder = Path(folder)
    tiny_neucodec(seed).save_pretrained(folder)
    return folder


# Mimi's released rates and code layout (24 kHz, the default SEANet ratios [8, 6, 5, 4] and the downsampling to
# 12.5 Hz: 1920 samples per frame; 32 quantizers of 2048 codes, the first semantic) with every width shrunk:
# about 0.1 M parameters and 0.5 M codebook entries (2.8 MB).
TINY_MIMI = dict(hidden_size=16, num_filters=4, num_hidden_layers=1, intermediate_size=32, num_attention_heads=2,
                 num_key_value_heads=2, codebook_size=2048, codebook_dim=8, vector_quantization_hidden_dimension=8,
                 num_quantizers=32, num_semantic_quantizers=1, upsample_groups=16, sliding_window=16,
                 max_position_embeddings=256)


def tiny_mimi(seed: int = 0):
    """A random-init ``MimiModel`` (eval mode) of the sizes above. transformers' init leaves every codebook at zero,
    so every frame would encode to code 0: the codebooks are drawn from a seeded N(0, 1) instead (the quantiser's
    inputs have a std of about 5 on a chirp, so codes spread over the codebook and follow the audio)."""
    from transformers import MimiConfig, MimiModel

    torch.manual_seed(seed)
    model = MimiModel(MimiConfig(**TINY_MIMI)).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if type(module).__name__ == "MimiEuclideanCodebook":
                module.embed_sum.copy_(torch.randn(module.embed_sum.shape, generator=generator))
                module._embed = None  # the codebook caches embed_sum / cluster_usage on first use
    return model


def save_tiny_mimi(folder: Path | str, seed: int = 0) -> Path:
    """Write a tiny Mimi to ``folder`` (config.json + model.safetensors); returns the folder."""
    folder = Path(folder)
    tiny_mimi(seed).save_pretrained(folder)
    return folder
