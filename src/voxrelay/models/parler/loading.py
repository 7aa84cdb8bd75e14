"""Building, loading and saving ``parler`` models: a new decoder over a pretrained T5 (training from scratch),
an upstream Parler model or ``checkpoint-*`` folder (through :mod:`.keymap`), or a voxrelay folder.

A saved folder keeps upstream's layout — ``config.json`` (upstream's ParlerTTSConfig fields) and
``model.safetensors`` with upstream's names — without the DAC, which is the prepared data's codec; the two
tokenizers go to ``description_tokenizer/`` and ``prompt_tokenizer/``; ``voxrelay.json`` is written last.
A LoRA model saves its adapter instead of ``model.safetensors`` (peft's files on upstream's module names);
:mod:`.export` writes upstream's own format, the DAC included.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import torch

from voxrelay import storage
from voxrelay.errors import UserError, one_line
from voxrelay.hf_weights import WeightsFileError
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
    if cfg.weights_dtype in ("bfloat16", "float16"):  # auto, resolved by the run (registry.as_trained): float32
        module.to(getattr(torch, cfg.weights_dtype))
    desc_tok, prompt_tok = tokenizers(cfg, meta)
    return Parler(module, desc_tok, prompt_tok, list(data.speakers), settings(cfg, config), cfg.init_from)


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
    folder = _local(source, "model.init_from", weights=not meta, needs="")
    home = config_home(folder)
    if not (home / "config.json").is_file():
        raise ParlerLoadError(f"model.init_from={source!r}: neither the folder nor its parent has a config.json; "
                              "give an upstream model folder, or a checkpoint-* folder inside the output_dir that "
                              "upstream's training script wrote its config.json into")
    raw = json.loads((home / "config.json").read_text())
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
    except (keymap.UpstreamKeyError, WeightsFileError, OSError) as e:
        raise ParlerLoadError(f"model.init_from={source}: {one_line(e)}") from None
    return config, state


def config_home(folder: Path) -> Path:
    """``folder``, or for an upstream training ``checkpoint-*`` folder (accelerate's ``save_state``: weights,
    optimizer and RNG states, no config.json) the ``output_dir`` above it, where upstream's training script saved
    the config and the transcript tokenizer once."""
    if (folder / "config.json").is_file() or not (folder.parent / "config.json").is_file():
        return folder
    return folder.parent


def _local(source: str, what: str, weights: bool = True, needs: str = "config.json") -> Path:
    """A local folder for ``source``: itself (holding ``needs``), a copy of a bucket folder, or a hub snapshot
    (config and tokenizer files; weights if asked)."""
    if "://" in source and not storage.is_local(source):
        source = str(_from_bucket(source, what, weights))
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


SMALL_FILES = re.compile(r".*\.(json|model|txt)$")  # configs and tokenizers
WEIGHTS = re.compile(r"^(model|pytorch_model)(-\d+-of-\d+)?\.(safetensors|bin)$")


def _from_bucket(uri: str, what: str, weights: bool = True) -> Path:
    """A copy of the files directly under ``uri`` (gs://, s3://: an upstream model or checkpoint in the bucket, as
    seed 000 resumes from) in the local cache, fetched once (files of the same size are kept): configs, tokenizers
    and, if asked, weights, never optimizer or RNG states. A ``checkpoint-*`` folder without a config.json lands
    in ``<copy>/<its name>/`` under the small files of its parent (the training ``output_dir``)."""
    local = cache_dir("init_from", uri_key(uri))
    sizes = storage.file_sizes(uri)
    if not sizes:
        raise ParlerLoadError(f"{what}={uri!r}: no files there; give the folder of an upstream model or checkpoint")
    wanted = {n: s for n, s in sizes.items() if SMALL_FILES.match(n) or (weights and WEIGHTS.match(n))}
    folder = local
    if "config.json" not in sizes:
        folder = local / uri.rstrip("/").rsplit("/", 1)[-1]
        parent = uri.rstrip("/").rsplit("/", 1)[0]
        _fetch(parent, local, {n: s for n, s in storage.file_sizes(parent).items() if SMALL_FILES.match(n)})
    _fetch(uri, folder, wanted)
    return folder


def _fetch(uri: str, local: Path, sizes: dict[str, int]) -> None:
    for name, size in sizes.items():
        target = storage.checked_join(local, name, f"the listing of {uri}", single=True)
        if not (target.is_file() and target.stat().st_size == size):
            storage.get_file(storage.join(uri, name), target)


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
    base = _tokenizer_home(cfg.init_from) if cfg.init_from else None
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


def _tokenizer_home(source: str) -> str | None:
    """Where ``model.init_from``'s tokenizer is: the folder, a checkpoint's output_dir, a hub repo; None if none."""
    remote = "://" in source and not storage.is_local(source)
    folder = _from_bucket(source, "model.init_from", weights=False) if remote else Path(source).expanduser()
    if not folder.is_dir():
        return source  # a hub repo ships its tokenizer
    home = config_home(folder)
    return str(home) if any((home / n).is_file() for n in ("tokenizer.json", "spiece.model")) else None


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
    model.base_source = cfg.init_from
    return model


def load_folder(folder: str | os.PathLike[str]) -> Parler:
    """A folder written by :func:`save_folder`."""
    folder = Path(folder)
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


def save_folder(model: Parler, folder: Path) -> None:
    from safetensors.torch import save_file

    from voxrelay.models.parler.export import save_adapter, upstream_config

    folder.mkdir(parents=True, exist_ok=True)
    if hasattr(model.module, "peft_config"):  # a LoRA model: its adapter, on upstream's module names
        save_adapter(model.module, folder, model.base_source)
        config = model.module.get_base_model().config
    else:
        config = model.module.config
        state = keymap.to_upstream_state(
            {k: v.detach().cpu().contiguous() for k, v in model.module.state_dict().items()}, config)
        save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(upstream_config(config), indent=2))
    model.description_tokenizer.save_pretrained(str(folder / DESCRIPTION_TOKENIZER))
    model.prompt_tokenizer.save_pretrained(str(folder / PROMPT_TOKENIZER))
    s = model.settings
    write_meta(folder, {"family": "parler", "format_version": FORMAT_VERSION, "speakers": model.speakers,
                        "settings": {"max_description_tokens": s.max_description_tokens,
                                     "max_prompt_tokens": s.max_prompt_tokens,
                                     "codebook_weights": list(s.codebook_weights) if s.codebook_weights else None}})
