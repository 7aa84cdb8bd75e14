"""Building, loading and saving ``parler`` models: a new decoder over a pretrained T5 (training from scratch),
an upstream Parler model or ``checkpoint-*`` folder (through :mod:`.keymap`), or a voxrelay folder.

A saved folder keeps upstream's layout — ``config.json`` (upstream's ParlerTTSConfig fields) and
``model.safetensors`` with upstream's names — without the DAC, which is the prepared data's codec; the two
tokenizers go to ``description_tokenizer/`` and ``prompt_tokenizer/``; ``voxrelay.json`` is written last.
:func:`export_upstream` adds the DAC in descript's weight-normed layout, which upstream's
``ParlerTTSForConditionalGeneration.from_pretrained`` loads.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from voxrelay import storage
from voxrelay.errors import UserError, one_line
from voxrelay.models.base import DataSpec
from voxrelay.models.hf import looks_local, read_meta, write_meta
from voxrelay.models.parler import keymap
from voxrelay.models.parler.config import KNOWN_T5, ParlerFamilyConfig
from voxrelay.models.parler.model import Parler, ParlerSettings
from voxrelay.models.parler.modeling import ParlerConfig, ParlerDecoderConfig, ParlerModule, build_parler
from voxrelay.paths import cache_dir, uri_key

FORMAT_VERSION = 1
DESCRIPTION_TOKENIZER = "description_tokenizer"
PROMPT_TOKENIZER = "prompt_tokenizer"
FIX = "give a local folder (save_pretrained output) or a hub id reachable from here (HF_HUB_OFFLINE unset)"


class ParlerLoadError(UserError, ValueError):
    """A Parler part (weights, T5, tokenizer) cannot be loaded; the message names the key and the fix."""


# ------------------------------------------------------------------ building


def build(cfg: ParlerFamilyConfig, data: DataSpec, seed: int, meta: bool = False) -> Parler:
    """The model of ``cfg`` for ``data``: ``init_from``'s weights, or a new decoder (seeded) over the pretrained
    T5 of ``text_encoder``; ``meta`` builds shapes only (config files read, no weights)."""
    if cfg.init_from and _is_voxrelay(cfg.init_from):
        return _from_voxrelay(cfg, data)
    if cfg.init_from:
        config, state = _upstream(cfg.init_from, meta)
        _check_data(config, data, cfg.init_from)
    else:
        config, state = _new_config(cfg, data, meta), None
    module = build_parler(config, device="meta" if meta else "cpu", seed=seed)
    if state is not None:
        _load_state(module, state, f"model.init_from={cfg.init_from}")
    elif not meta:
        _load_t5(module, cfg.encoder_source())
    module.text_encoder.requires_grad_(not cfg.freeze_text_encoder)
    if cfg.weights_dtype == "bfloat16":
        module.to(torch.bfloat16)
    desc_tok, prompt_tok = tokenizers(cfg, meta)
    return Parler(module, desc_tok, prompt_tok, list(data.speakers), settings(cfg, config))


def settings(cfg: ParlerFamilyConfig, config: ParlerConfig) -> ParlerSettings:
    weights = cfg.codebook_weights if cfg.codebook_weights is not None else config.decoder.codebook_weights
    return ParlerSettings(cfg.max_description_tokens, cfg.max_prompt_tokens,
                          tuple(weights) if weights is not None else None)


def _new_config(cfg: ParlerFamilyConfig, data: DataSpec, meta: bool) -> ParlerConfig:
    """A new decoder of the preset's sizes for ``data``'s codec (vocab = codebook size + 64, EOS = PAD = the
    codebook size, BOS the next id, as upstream's init script); T5's config from ``text_encoder``."""
    source = cfg.encoder_source()
    if not source:
        raise ParlerLoadError(f"model.preset={cfg.preset} names no description encoder: set model.text_encoder to a "
                              "T5 folder or hub id (e.g. google/flan-t5-base)")
    t5 = _t5_config(source, meta)
    s, size = cfg.sizes(), data.codebook_size
    heads = s["num_heads"]
    decoder = ParlerDecoderConfig(
        vocab_size=size + 64, num_codebooks=data.num_codebooks, hidden_size=s["hidden_size"],
        num_hidden_layers=s["num_layers"], num_attention_heads=heads, num_key_value_heads=heads,
        num_cross_attention_key_value_heads=heads, ffn_dim=s["ffn_dim"],
        max_position_embeddings=s["max_position_embeddings"], dropout=s["dropout"],
        codebook_weights=tuple(cfg.codebook_weights) if cfg.codebook_weights else None,
        eos_token_id=size, bos_token_id=size + 1)
    prompt_vocab = _prompt_vocab(cfg, meta, t5)
    return ParlerConfig(text_encoder=t5.to_dict(), decoder=decoder, prompt_vocab_size=prompt_vocab)


def _t5_config(source: str, meta: bool) -> Any:
    """T5's config from ``source``; on meta, a preset's known encoder needs no download."""
    from transformers import T5Config

    try:
        return _auto_config(source, "model.text_encoder")
    except ParlerLoadError:
        if meta and source in KNOWN_T5:
            return T5Config.from_dict(KNOWN_T5[source])
        raise


def _prompt_vocab(cfg: ParlerFamilyConfig, meta: bool, t5: Any) -> int:
    """Rows of ``embed_prompts``: the transcript tokenizer's size (upstream: ``len(tokenizer)``); on meta
    without a reachable tokenizer, T5's vocabulary (upstream's init script uses ``t5.vocab_size``)."""
    try:
        return len(_tokenizer(cfg.prompt_tokenizer_source() or cfg.encoder_source(), "model.prompt_tokenizer"))
    except ParlerLoadError:
        if meta:
            return int(t5.vocab_size)
        raise


def _check_data(config: ParlerConfig, data: DataSpec, source: str) -> None:
    dec = config.decoder
    if data.num_codebooks != dec.num_codebooks or data.codebook_size != dec.eos_token_id:
        raise ParlerLoadError(
            f"model.init_from={source} predicts {dec.num_codebooks} codebooks of {dec.eos_token_id} codes, but the "
            f"prepared data has {data.num_codebooks} x {data.codebook_size}; prepare with the model's DAC "
            "(codec.type=dac, codec.path=parler-tts/dac_44khZ_8kbps) under another data.name")


# ------------------------------------------------------------------ upstream folders


def _upstream(source: str, meta: bool) -> tuple[ParlerConfig, dict | None]:
    """(config, module state) of an upstream model or ``checkpoint-*`` folder (or hub id); no state on meta."""
    folder = _local(source, "model.init_from", weights=not meta)
    raw = json.loads((folder / "config.json").read_text())
    if raw.get("model_type") != "parler_tts":
        raise ParlerLoadError(f"model.init_from={source}: config.json says model_type={raw.get('model_type')!r}, not "
                              "'parler_tts'; give an upstream Parler-TTS model or checkpoint folder")
    try:
        config = keymap.config_from_upstream(raw)
    except (ValueError, TypeError, KeyError) as e:
        raise ParlerLoadError(f"model.init_from={source}: {one_line(e)}") from None
    if meta:
        return config, None
    try:
        state, _dac = keymap.split_upstream_state(keymap.read_upstream_state(folder), config)
    except (keymap.UpstreamKeyError, FileNotFoundError, OSError) as e:
        raise ParlerLoadError(f"model.init_from={source}: {one_line(e)}") from None
    return config, state


def _local(source: str, what: str, weights: bool = True, needs: str = "config.json") -> Path:
    """A local folder for ``source``: itself (holding ``needs``), or a hub snapshot (config and tokenizer
    files; weights if asked)."""
    if "://" in source and not storage.is_local(source):
        source = str(_from_bucket(source, what))
    folder = Path(source).expanduser()
    if folder.is_dir():
        if needs and not (folder / needs).is_file():
            raise ParlerLoadError(f"{what}={source!r}: the folder has no {needs}; {FIX}")
        return folder
    if looks_local(source):
        raise ParlerLoadError(f"{what}={source!r}: no such folder (and not a hub id); {FIX}")
    from huggingface_hub import snapshot_download

    patterns = ["*.json", "*.model", "*.txt"] + (["*.safetensors"] if weights else [])
    try:
        return Path(snapshot_download(source, allow_patterns=patterns))
    except Exception as e:  # the hub client's errors have no common base worth naming
        raise ParlerLoadError(f"{what}={source!r}: cannot be fetched ({one_line(e)[:200]}); {FIX}") from None


def _from_bucket(uri: str, what: str) -> Path:
    """A copy of the files directly under ``uri`` (gs://, s3://: an upstream checkpoint in the bucket, as seed 000
    resumes from) in the local cache, fetched once (files of the same size are kept)."""
    local = cache_dir("init_from", uri_key(uri))
    sizes = storage.file_sizes(uri)
    if not sizes:
        raise ParlerLoadError(f"{what}={uri!r}: no files there; give the folder of an upstream model or checkpoint")
    for name, size in sizes.items():
        target = local / name
        if not (target.is_file() and target.stat().st_size == size):
            storage.get_file(storage.join(uri, name), target)
    return local


def _load_state(module: ParlerModule, state: dict, what: str) -> None:
    missing, unexpected = module.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.endswith("embed_positions.weights")]  # recomputed sinusoids
    if missing or unexpected:
        raise ParlerLoadError(f"{what}: weights do not fit its config.json (missing {missing[:3]}, unexpected "
                              f"{unexpected[:3]}); use the config.json saved with these weights")


def _load_t5(module: ParlerModule, source: str) -> None:
    from transformers import T5EncoderModel

    try:
        t5 = T5EncoderModel.from_pretrained(str(_local(source, "model.text_encoder")), dtype=torch.float32)
    except (OSError, ValueError) as e:
        raise ParlerLoadError(f"model.text_encoder={source!r}: cannot load a T5 encoder ({one_line(e)[:200]}); "
                              f"{FIX}") from None
    _load_state(module.text_encoder, t5.state_dict(), f"model.text_encoder={source}")


def _auto_config(source: str, what: str) -> Any:
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(str(_local(source, what, weights=False)))
    except (OSError, ValueError, KeyError) as e:
        raise ParlerLoadError(f"{what}={source!r}: its config.json cannot be read ({one_line(e)[:200]}); {FIX}") \
            from None


# ------------------------------------------------------------------ tokenizers


def tokenizers(cfg: ParlerFamilyConfig, meta: bool = False) -> tuple[Any, Any]:
    """(description tokenizer, prompt tokenizer); on meta, None for one that cannot be reached (planning then
    needs --seq-len)."""
    base = cfg.init_from if cfg.init_from and _has_tokenizer(cfg.init_from) else None
    desc_source = cfg.description_tokenizer or cfg.text_encoder or base or cfg.encoder_source()
    prompt_source = cfg.prompt_tokenizer_source() if cfg.prompt_tokenizer or cfg.preset == "mini-v1.1" else None
    prompt_source = prompt_source or base or desc_source
    loaded = []
    for source, key in ((desc_source, "model.description_tokenizer"), (prompt_source, "model.prompt_tokenizer")):
        try:
            loaded.append(_tokenizer(source, key))
        except ParlerLoadError:
            if not meta:
                raise
            loaded.append(None)
    return loaded[0], loaded[1]


def _has_tokenizer(source: str) -> bool:
    folder = Path(source).expanduser()
    return not folder.is_dir() or any((folder / name).is_file() for name in ("tokenizer.json", "spiece.model"))


def _tokenizer(source: str | None, what: str) -> Any:
    from transformers import AutoTokenizer

    if not source:
        raise ParlerLoadError(f"{what} is not set and nothing else names a tokenizer; set {what}")
    folder = _local(source, what, weights=False, needs="")
    try:
        return AutoTokenizer.from_pretrained(str(folder))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ParlerLoadError(f"{what}={source!r}: cannot load a tokenizer ({one_line(e)[:200]}); {FIX}") from None


# ------------------------------------------------------------------ voxrelay folders


def _is_voxrelay(source: str) -> bool:
    from voxrelay.paths import EXPORT_META

    return (Path(source).expanduser() / EXPORT_META).is_file()


def _from_voxrelay(cfg: ParlerFamilyConfig, data: DataSpec) -> Parler:
    model = load_folder(Path(cfg.init_from).expanduser())
    _check_data(model.config, data, cfg.init_from)
    model.module.text_encoder.requires_grad_(not cfg.freeze_text_encoder)
    model.speakers = list(data.speakers)
    model.settings = settings(cfg, model.config)
    return model


def load_folder(folder: Path) -> Parler:
    """A folder written by :func:`save_folder`."""
    meta = read_meta(folder, "parler", FORMAT_VERSION)
    config = keymap.config_from_upstream(json.loads((folder / "config.json").read_text()))
    module = build_parler(config, device="meta")
    state, _ = keymap.split_upstream_state(keymap.read_upstream_state(folder), config)
    module = module.to_empty(device="cpu")
    module.reset_positions()
    _load_state(module, state, str(folder))
    desc = _tokenizer(str(folder / DESCRIPTION_TOKENIZER), "description tokenizer")
    prompt = _tokenizer(str(folder / PROMPT_TOKENIZER), "prompt tokenizer")
    saved = meta.get("settings") or {}
    weights = saved.get("codebook_weights")
    settings_ = ParlerSettings(int(saved.get("max_description_tokens", 256)), int(saved.get("max_prompt_tokens", 600)),
                               tuple(weights) if weights else None)
    return Parler(module, desc, prompt, list(meta.get("speakers") or []), settings_)


def upstream_config(config: ParlerConfig, audio_encoder: dict | None = None) -> dict[str, Any]:
    """Upstream's ``config.json`` for ``config`` (ParlerTTSConfig with its three sub-configs)."""
    dec = {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(config.decoder).items()}
    eos, bos = config.decoder.eos_token_id, config.decoder.bos_token_id
    dec |= {"model_type": "parler_tts_decoder", "pad_token_id": eos, "architectures": ["ParlerTTSForCausalLM"],
            "layerdrop": 0.0, "scale_embedding": False, "is_decoder": True, "add_cross_attention": True}
    return {"model_type": "parler_tts", "architectures": ["ParlerTTSForConditionalGeneration"],
            "text_encoder": config.text_encoder, "audio_encoder": audio_encoder or config.audio_encoder,
            "decoder": dec, "vocab_size": config.prompt_vocab_size,
            "prompt_cross_attention": False, "pad_token_id": eos,
            "decoder_start_token_id": bos, "is_encoder_decoder": True}


def save_folder(model: Parler, folder: Path) -> None:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    module = model.module.get_base_model() if hasattr(model.module, "get_base_model") else model.module
    config = module.config
    state = keymap.to_upstream_state({k: v.detach().cpu().contiguous() for k, v in module.state_dict().items()},
                                     config)
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(upstream_config(config), indent=2))
    model.description_tokenizer.save_pretrained(str(folder / DESCRIPTION_TOKENIZER))
    model.prompt_tokenizer.save_pretrained(str(folder / PROMPT_TOKENIZER))
    s = model.settings
    write_meta(folder, {"family": "parler", "format_version": FORMAT_VERSION, "speakers": model.speakers,
                        "settings": {"max_description_tokens": s.max_description_tokens,
                                     "max_prompt_tokens": s.max_prompt_tokens,
                                     "codebook_weights": list(s.codebook_weights) if s.codebook_weights else None}})


def save_upstream(model: Parler, folder: Path, codec: Any) -> None:
    """Upstream's own format (``export --format parler``): ``config.json`` with the DAC as upstream's descript
    wrapper (``dac_on_the_hub``), ``model.safetensors`` with every weight under upstream's names (the DAC
    weight-normed under ``audio_encoder.model.*``), ``generation_config.json``, and the transcript tokenizer at
    the root as upstream's training saves it (the description tokenizer in ``description_tokenizer/``):
    ``ParlerTTSForConditionalGeneration.from_pretrained(folder)`` loads it."""
    from safetensors.torch import save_file

    dac = getattr(codec, "model", None)
    if getattr(codec, "name", None) != "dac" or dac is None:
        raise ParlerLoadError(f"export --format parler needs the run's codec to be a DAC (codec.type=dac), not "
                              f"{getattr(codec, 'name', codec)!r}; export without --format")
    folder.mkdir(parents=True, exist_ok=True)
    module = model.module.get_base_model() if hasattr(model.module, "get_base_model") else model.module
    config = module.config
    ours = {k: v.detach().cpu().contiguous() for k, v in module.state_dict().items()}
    dac_state = {k: v.detach().cpu().contiguous() for k, v in dac.state_dict().items()}
    state = keymap.to_upstream_state(ours, config, dac=dac_state, dac_layout="descript")
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    frame_rate = int(codec.frame_rate)  # upstream's 86 for 44.1 kHz / 512 (transformers' DacConfig says 87)
    audio = {"model_type": "dac_on_the_hub", "num_codebooks": codec.num_codebooks,
             "codebook_size": codec.codebook_size, "latent_dim": int(dac.config.hidden_size),
             "frame_rate": frame_rate, "sampling_rate": codec.sample_rate, "model_bitrate": 8}
    (folder / "config.json").write_text(json.dumps(upstream_config(config, audio), indent=2))
    eos, bos = config.decoder.eos_token_id, config.decoder.bos_token_id
    generation = {"decoder_start_token_id": bos, "pad_token_id": eos, "eos_token_id": eos, "do_sample": True,
                  "max_length": 30 * frame_rate, "_from_model_config": False}
    (folder / "generation_config.json").write_text(json.dumps(generation, indent=2))
    model.prompt_tokenizer.save_pretrained(str(folder))
    model.description_tokenizer.save_pretrained(str(folder / DESCRIPTION_TOKENIZER))
