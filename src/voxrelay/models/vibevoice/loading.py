"""Building a ``vibevoice`` model: transformers' ``VibeVoiceForConditionalGeneration`` from ``model.init_from``
(a hub id or folder in transformers' layout, or a voxrelay export), its Qwen2 tokenizer, the frozen parts
frozen; on the meta device (``plan``) from init_from's config.json or the preset's sizes."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import torch

from voxrelay.errors import one_line
from voxrelay.models.hf import FIX, ModelLoadError, ModelNotFoundError, from_pretrained_whole, looks_local

# model.weights_dtype; auto is resolved by the run (voxrelay.models.registry.as_trained): alone it is float32
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "auto": torch.float32}
FROZEN = ("model.audio_tower.", "model.semantic_tokenizer_encoder.", "model.latent_scaling_factor",
          "model.latent_bias_factor")  # rebuilt from init_from, never trained, never checkpointed
LATENTS = "vibevoice_latents"  # codec.type of data that holds the encoders' outputs
SPECIAL = {"bos": "<|vision_start|>", "end": "<|vision_end|>", "pad": "<|vision_pad|>", "eos": "<|endoftext|>"}

# Sizes of the released checkpoints (Qwen2.5-1.5B / 7B LMs, 4-layer diffusion heads, the σ-VAE and semantic
# encoder at transformers' defaults), for planning without a download.
_QWEN = {"model_type": "qwen2", "max_position_embeddings": 65536, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
         "hidden_act": "silu"}
PRESETS: dict[str, dict[str, Any]] = {
    "1.5B": {"text_config": _QWEN | {"vocab_size": 151936, "hidden_size": 1536, "intermediate_size": 8960,
                                     "num_hidden_layers": 28, "num_attention_heads": 12, "num_key_value_heads": 2,
                                     "tie_word_embeddings": True},
             "diffusion_head_config": {"num_hidden_layers": 4, "intermediate_size": 4608}},
    "7B": {"text_config": _QWEN | {"vocab_size": 152064, "hidden_size": 3584, "intermediate_size": 18944,
                                   "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
                                   "tie_word_embeddings": False},
           "diffusion_head_config": {"num_hidden_layers": 4, "intermediate_size": 10752}},
}


def _source(spec: str, what: str) -> str:
    folder = Path(spec).expanduser()
    if not folder.is_dir() and looks_local(spec):
        raise ModelNotFoundError(f"{what}={spec!r}: no such folder (and not a hub id); {FIX}")
    if folder.is_dir() and not (folder / "config.json").is_file():
        raise ModelNotFoundError(f"{what}={spec!r}: the folder has no config.json; {FIX}")
    return str(folder) if folder.is_dir() else spec


def load_config(spec: str, what: str, dropout: float | None = None) -> Any:
    """The ``VibeVoiceConfig`` of ``spec`` (config.json only), with the LM's attention dropout set."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(_source(spec, what))
    except (OSError, ValueError, KeyError) as e:
        raise ModelLoadError(f"{what}={spec!r}: its config.json cannot be read ({one_line(e)[:300]}); {FIX}") from e
    if getattr(config, "model_type", None) != "vibevoice":
        raise ModelLoadError(f"{what}={spec!r} is a {getattr(config, 'model_type', '?')} model, not VibeVoice; point "
                             "it at a VibeVoice checkpoint in transformers' layout (e.g. bezzam/VibeVoice-1.5B-hf)")
    if dropout is not None:
        config.text_config.attention_dropout = dropout
    return config


def load_net(spec: str, what: str, dtype: str = "float32", dropout: float | None = None) -> Any:
    """``VibeVoiceForConditionalGeneration`` with ``spec``'s weights; weights that leave part of it random are
    refused; the tokenizers and latent factors frozen."""
    from transformers import VibeVoiceForConditionalGeneration

    config = load_config(spec, what, dropout)
    net = from_pretrained_whole(VibeVoiceForConditionalGeneration, spec, _source(spec, what), what,
                                config=config, dtype=DTYPES[dtype])
    freeze(net)
    return net


def freeze(net: torch.nn.Module) -> None:
    """The tokenizers frozen; the latent factors (0-d parameters, trainable by default upstream) made buffers:
    never trained, still saved by save_pretrained, and FSDP2 shards no 0-d parameter."""
    for name in ("latent_scaling_factor", "latent_bias_factor"):
        value = getattr(net.model, name)
        if isinstance(value, torch.nn.Parameter):
            delattr(net.model, name)
            net.model.register_buffer(name, value.detach().clone())
    for name, p in net.named_parameters():
        if name.startswith(FROZEN):
            p.requires_grad_(False)


def meta_net(spec: str, preset: str, dropout: float, dtype: str = "float32") -> Any:
    """The model on the meta device (no weights read) in ``dtype`` (``model.weights_dtype``): init_from's
    config.json when it is a local folder, else the preset's sizes."""
    from transformers import VibeVoiceConfig, VibeVoiceForConditionalGeneration

    if Path(spec).expanduser().is_dir():
        config = load_config(spec, "model.init_from", dropout)
    else:
        sizes = copy.deepcopy(PRESETS[preset])
        config = VibeVoiceConfig(**sizes)
    with torch.device("meta"):
        net = VibeVoiceForConditionalGeneration(config).to(DTYPES[dtype])
    freeze(net)
    return net


def load_tokenizer(spec: str, what: str) -> Any:
    """The Qwen2 tokenizer of ``spec``, checked to hold VibeVoice's special tokens."""
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(_tokenizer_source(spec, what))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ModelLoadError(f"{what}={spec!r} has no loadable tokenizer ({one_line(e)[:300]}); set model.tokenizer "
                             "to a Qwen2 tokenizer folder or hub id (e.g. Qwen/Qwen2.5-1.5B)") from e
    vocab = tok.get_vocab()
    unknown = [t for t in SPECIAL.values() if t not in vocab]
    if unknown:
        raise ModelLoadError(f"{what}={spec!r}: its tokenizer lacks {unknown}; set model.tokenizer to a Qwen2 "
                             "tokenizer (e.g. Qwen/Qwen2.5-1.5B)")
    return tok


def _tokenizer_source(spec: str, what: str) -> str:
    folder = Path(spec).expanduser()
    if not folder.is_dir() and looks_local(spec):
        raise ModelNotFoundError(f"{what}={spec!r}: no such folder (and not a hub id)")
    return str(folder) if folder.is_dir() else spec


def special_ids(tokenizer: Any, config: Any) -> dict[str, int]:
    """The ids of the special tokens, checked against the model's config."""
    ids = {key: int(tokenizer.convert_tokens_to_ids(token)) for key, token in SPECIAL.items()}
    expect = {"bos": config.audio_bos_token_id, "end": config.audio_eos_token_id, "pad": config.audio_token_id,
              "eos": config.eos_token_id}
    if ids != expect:
        raise ModelLoadError(f"the tokenizer's special ids {ids} are not the model's {expect}; set model.tokenizer to "
                             "the tokenizer of model.init_from")
    return ids


def build(cfg: Any, data: Any, seed: int, meta: bool = False) -> Any:
    """The family model of ``cfg`` (:class:`~voxrelay.models.vibevoice.config.VibeVoiceFamilyConfig`); the global
    RNG is left as it was."""
    with torch.random.fork_rng(devices=[]):
        if meta:  # planning: sizes only; the tokenizer when it is at hand (example lengths of prepared data)
            net = meta_net(cfg.init_from, cfg.preset, cfg.dropout, cfg.weights_dtype)
            try:
                tokenizer = load_tokenizer(cfg.tokenizer or cfg.init_from, "model.init_from")
            except ModelLoadError:
                tokenizer = None
        else:
            net = load_net(cfg.init_from, "model.init_from", cfg.weights_dtype, cfg.dropout)
            what = "model.tokenizer" if cfg.tokenizer else "model.init_from"
            tokenizer = load_tokenizer(cfg.tokenizer or cfg.init_from, what)
    settings = {key: getattr(cfg, key) for key in SETTINGS}
    model = assemble(net, tokenizer, seed, cfg.max_length, cfg.voice_prompt_drop_rate, settings,
                     int(cfg.feature_cache_gb * 2**30))
    stored = getattr(data, "codec", None) or {}
    if stored.get("type") == LATENTS:  # the data holds the encoders' outputs, not the audio
        if not meta:
            check_encoders(net, stored, cfg.init_from)
        model.maker.features = True
    return model


def check_encoders(net: Any, stored: dict, init_from: str) -> None:
    """Refuse prepared latents made by other encoders than ``net``'s (the data's ``encoders_sketch``, dims, hop and
    extraction), naming the fix."""
    from voxrelay.models.vibevoice.latent_codec import mismatch

    inner = net.model
    why = mismatch(stored, inner.audio_tower.encoder, inner.semantic_tokenizer_encoder,
                   int(inner.config.audio_config.hop_length))
    if why:
        raise ModelLoadError(
            f"the prepared data holds latents of the encoders of {stored.get('path')!r} (codec.type={LATENTS}), but "
            f"they do not fit model.init_from={init_from!r} ({why}), so those latents mean nothing to it; prepare the "
            f"data again with codec.path={init_from} under another data.name, or with codec.type=pcm (the audio, "
            "which any VibeVoice encodes itself)")


SETTINGS = ("ce_loss_weight", "diffusion_loss_weight", "ddpm_batch_multiplier", "ema_decay", "train_diffusion_head",
            "train_connectors", "diffusion_steps", "guidance_scale")


def assemble(net: Any, tokenizer: Any, seed: int, max_length: int, drop_rate: float, settings: dict,
             cache_bytes: int = 0) -> Any:
    from voxrelay.models.vibevoice.examples import ExampleMaker
    from voxrelay.models.vibevoice.model import VibeVoice
    from voxrelay.models.vibevoice.modeling import FeatureCache, VibeVoiceTrainer

    config = net.config
    ids = special_ids(tokenizer, config) if tokenizer is not None else \
        {"bos": config.audio_bos_token_id, "end": config.audio_eos_token_id, "pad": config.audio_token_id,
         "eos": config.eos_token_id}
    generator = torch.Generator()
    generator.manual_seed(seed)
    module = VibeVoiceTrainer(net, int(settings["ddpm_batch_multiplier"]), generator, FeatureCache(cache_bytes))
    maker = ExampleMaker(tokenizer, ids, int(config.audio_config.hop_length), seed, drop_rate)
    return VibeVoice(module, maker, max_length, settings)


def load_folder(folder: str | os.PathLike[str]) -> Any:
    """A folder written by ``VibeVoice.save_pretrained`` (no network access)."""
    from voxrelay.models.vibevoice.model import load_meta

    folder = Path(folder)
    meta = load_meta(folder)
    what = f"model folder {str(folder)!r}"
    net = load_net(str(folder), what)
    tokenizer = load_tokenizer(str(folder), what)
    settings = dict(meta["settings"])
    return assemble(net, tokenizer, 0, int(meta["max_length"]), 0.0, settings)
