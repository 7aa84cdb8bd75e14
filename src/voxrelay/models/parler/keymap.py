"""Upstream parler-tts 0.2.3 formats <-> ours: ``config.json`` and state-dict names.

An upstream state dict (``save_pretrained`` folder, or an accelerate ``checkpoint-*`` folder) splits into
the :class:`~.modeling.ParlerModule` state dict (same names, minus ``audio_encoder.*``) and a DAC state
dict in transformers ``DacModel`` layout. Differences handled here:

- a fused ``decoder.lm_heads.weight`` [K*V, D] (``use_fused_lm_heads``) is K heads stacked along dim 0;
- upstream files omit the tied ``text_encoder.encoder.embed_tokens.weight`` (= ``text_encoder.shared``)
  and may omit the sinusoid table ``decoder...embed_positions.weights``: both are restored;
- the DAC comes as descript's wrapper ``audio_encoder.model.{encoder,decoder,quantizer}...`` (nn.Sequential
  indices, weight-normed convs stored as ``weight_g/weight_v`` or ``parametrizations.weight.original0/1``)
  or, as in v1.1, already as ``audio_encoder.{encoder,decoder,quantizer}...`` (DacModel names). DacModel
  (transformers 5) has plain ``weight`` tensors: weight norm is folded in, ``w = g * v / ||v||`` with the
  norm over every dim but 0, as ``torch.nn.utils.weight_norm(dim=0)`` computes it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import Field, fields
from pathlib import Path
from typing import Any

import torch
from transformers import DacConfig

from voxrelay.models.parler.modeling import ParlerConfig, ParlerDecoderConfig, build_parler, sinusoid_table

State = dict[str, torch.Tensor]

AUDIO = "audio_encoder."
DESCRIPT = "audio_encoder.model."
TIED_T5 = "text_encoder.encoder.embed_tokens.weight"
DECODER_POSITIONS = "decoder.model.decoder.embed_positions.weights"
FUSED_HEADS = "decoder.lm_heads.weight"
_WRAPPERS = ("module.", "_orig_mod.")  # DDP / torch.compile prefixes in training checkpoints
_NORM_SUFFIXES = {  # weight-norm storage -> (magnitude g, direction v)
    "weight_g": "g",
    "weight_v": "v",
    "parametrizations.weight.original0": "g",
    "parametrizations.weight.original1": "v",
}
_RESIDUAL_UNIT = ("snake1", "conv1", "snake2", "conv2")


class UpstreamKeyError(ValueError):
    """A state dict holds names this mapping does not know (or lacks ones the model needs)."""


def config_from_upstream(config: Mapping[str, Any]) -> ParlerConfig:
    """Upstream's top-level ``config.json`` dict (``text_encoder``, ``audio_encoder``, ``decoder``, ``vocab_size``)."""
    missing = [key for key in ("text_encoder", "decoder", "vocab_size") if key not in config]
    if missing:
        raise ValueError(f"not an upstream Parler-TTS config.json: missing {missing}")
    if config.get("prompt_cross_attention"):  # no released checkpoint (mini v0.1/v1/v1.1, large v1) uses it
        raise ValueError("prompt_cross_attention=true is not supported: the transcript must be prepended")
    dec = dict(config["decoder"])
    if float(dec.get("layerdrop") or 0.0) != 0.0:
        raise ValueError(f"decoder.layerdrop={dec['layerdrop']} is not supported; set it to 0.0")
    cross = dec.get("cross_attention_hidden_size")
    if cross is not None and int(cross) != int(dec["hidden_size"]):
        raise ValueError(f"decoder.cross_attention_hidden_size={cross} != hidden_size: not supported (set it to null)")
    heads = int(dec["num_attention_heads"])
    kv_heads = int(dec.get("num_key_value_heads") or heads)
    weights = dec.get("codebook_weights")
    decoder = ParlerDecoderConfig(
        **{f.name: dec[f.name] for f in _scalar_fields() if dec.get(f.name) is not None},
        num_key_value_heads=kv_heads,
        num_cross_attention_key_value_heads=int(dec.get("num_cross_attention_key_value_heads") or kv_heads),
        codebook_weights=tuple(float(w) for w in weights) if weights is not None else None,
    )
    return ParlerConfig(
        text_encoder=dict(config["text_encoder"]),
        decoder=decoder,
        prompt_vocab_size=int(config["vocab_size"]),
        audio_encoder=dict(config.get("audio_encoder") or {}),
    )


def _scalar_fields() -> list[Field]:
    """ParlerDecoderConfig fields copied as-is from upstream's decoder dict."""
    special = {"num_key_value_heads", "num_cross_attention_key_value_heads", "codebook_weights"}
    return [f for f in fields(ParlerDecoderConfig) if f.name not in special]


def dac_config_from_upstream(audio_encoder: Mapping[str, Any]) -> DacConfig:
    """transformers ``DacConfig`` for upstream's ``audio_encoder`` dict (descript 44.1 kHz wrapper or DacModel's)."""
    if audio_encoder.get("model_type") == "dac":  # v1.1: already a transformers DacConfig
        return DacConfig.from_dict(dict(audio_encoder))
    # descript's DAC(...) defaults, as upstream's DACModel builds it from num_codebooks/latent_dim/codebook_size
    return DacConfig(
        encoder_hidden_size=64,
        downsampling_ratios=[2, 4, 8, 8],
        decoder_hidden_size=1536,
        upsampling_ratios=[8, 8, 4, 2],
        n_codebooks=int(audio_encoder.get("num_codebooks", 9)),
        codebook_size=int(audio_encoder.get("codebook_size", 1024)),
        codebook_dim=8,
        hidden_size=int(audio_encoder.get("latent_dim", 1024)),
        sampling_rate=int(audio_encoder.get("sampling_rate", 44100)),
        hop_length=512,
    )


def read_upstream_state(folder: str | Path) -> State:
    """All tensors of an upstream folder: ``model.safetensors``, or the shards its index lists."""
    from safetensors.torch import load_file

    folder = Path(folder)
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return {k: v for shard in shards for k, v in load_file(folder / shard).items()}
    single = folder / "model.safetensors"
    if not single.is_file():
        raise FileNotFoundError(f"{str(folder)!r} has no model.safetensors(.index.json); give an upstream model folder")
    return load_file(single)


def split_upstream_state(state: Mapping[str, torch.Tensor], config: ParlerConfig) -> tuple[State, State]:
    """Upstream state dict -> (ParlerModule state dict, DacModel state dict; empty if no ``audio_encoder.*``)."""
    ours: State = {}
    audio: State = {}
    for key, value in state.items():
        for prefix in _WRAPPERS:
            key = key.removeprefix(prefix)
        (audio if key.startswith(AUDIO) else ours)[key] = value
    if FUSED_HEADS in ours:
        ours.update(_split_heads(ours.pop(FUSED_HEADS), config.decoder))
    if TIED_T5 not in ours and "text_encoder.shared.weight" in ours:
        ours[TIED_T5] = ours["text_encoder.shared.weight"]
    _fill_sinusoids(ours, config)
    check_keys(ours, config)
    return ours, dac_state_from_upstream(audio)


def to_upstream_state(
    ours: Mapping[str, torch.Tensor],
    config: ParlerConfig,
    dac: Mapping[str, torch.Tensor] | None = None,
    dac_layout: str = "descript",
    weight_norm: str = "parametrizations",
) -> State:
    """Export: ParlerModule (+ optional DacModel) state -> upstream names, loadable by upstream's ``from_pretrained``.

    ``dac_layout``: "descript" (``audio_encoder.model.*``, weight-normed: ``weight_norm`` "parametrizations"
    or "legacy" for ``weight_g/weight_v``) or "transformers" (``audio_encoder.*``, plain weights).
    The tied T5 embedding is left out, as upstream's ``save_pretrained`` does.
    """
    check_keys(ours, config)
    out = {k: v for k, v in ours.items() if k != TIED_T5}
    if config.decoder.use_fused_lm_heads:
        heads = [out.pop(f"decoder.lm_heads.{k}.weight") for k in range(config.decoder.num_codebooks)]
        out[FUSED_HEADS] = torch.cat(heads, dim=0)
    if dac:
        out.update(dac_state_to_upstream(dac, dac_layout, weight_norm))
    return out


def check_keys(ours: Mapping[str, torch.Tensor], config: ParlerConfig) -> None:
    """Raise :class:`UpstreamKeyError` naming unknown and missing keys (against a meta-device ParlerModule)."""
    expected = set(build_parler(config, device="meta").state_dict())
    unknown, missing = sorted(set(ours) - expected), sorted(expected - set(ours))
    if unknown or missing:
        raise UpstreamKeyError(
            f"state dict does not fit this Parler config: unknown keys {_few(unknown)}, missing keys {_few(missing)}; "
            "check that config.json belongs to these weights (codebooks, layers, heads, rope)"
        )


def _few(keys: list[str], limit: int = 8) -> str:
    return str(keys[:limit]) + (f" (+{len(keys) - limit} more)" if len(keys) > limit else "")


def _split_heads(fused: torch.Tensor, cfg: ParlerDecoderConfig) -> State:
    """Fused heads [K*V, D] -> K heads [V, D] (upstream views the output as [..., K, V])."""
    heads = fused.view(cfg.num_codebooks, cfg.vocab_size, -1)
    return {f"decoder.lm_heads.{k}.weight": heads[k].clone() for k in range(cfg.num_codebooks)}


def _fill_sinusoids(ours: State, config: ParlerConfig) -> None:
    """Recompute the sinusoid table if a checkpoint left it out (it is fixed, not learned)."""
    if not config.decoder.rope_embeddings and DECODER_POSITIONS not in ours:
        ours[DECODER_POSITIONS] = sinusoid_table(config.decoder.max_position_embeddings, config.decoder.hidden_size)


# --- DAC: descript wrapper <-> transformers DacModel ---------------------------------------------------------


def _dac_module_pairs(enc_blocks: int, dec_blocks: int, quantizers: int) -> list[tuple[str, str]]:
    """(descript module path, DacModel module path) for every module holding tensors."""
    pairs = [
        ("encoder.block.0", "encoder.conv1"),
        (f"encoder.block.{enc_blocks + 1}", "encoder.snake1"),
        (f"encoder.block.{enc_blocks + 2}", "encoder.conv2"),
        ("decoder.model.0", "decoder.conv1"),
        (f"decoder.model.{dec_blocks + 1}", "decoder.snake1"),
        (f"decoder.model.{dec_blocks + 2}", "decoder.conv2"),
    ]
    for i in range(1, enc_blocks + 1):  # EncoderBlock: 3 residual units, snake, strided conv
        ours = f"encoder.block.{i - 1}"
        pairs += [(f"encoder.block.{i}.block.3", f"{ours}.snake1"), (f"encoder.block.{i}.block.4", f"{ours}.conv1")]
        pairs += _residual_pairs(f"encoder.block.{i}.block", ours, first=0)
    for i in range(1, dec_blocks + 1):  # DecoderBlock: snake, transposed conv, 3 residual units
        ours = f"decoder.block.{i - 1}"
        pairs += [(f"decoder.model.{i}.block.0", f"{ours}.snake1"), (f"decoder.model.{i}.block.1", f"{ours}.conv_t1")]
        pairs += _residual_pairs(f"decoder.model.{i}.block", ours, first=2)
    for q in range(quantizers):
        pairs += [(f"quantizer.quantizers.{q}.{name}",) * 2 for name in ("in_proj", "out_proj", "codebook")]
    return pairs


def _residual_pairs(descript: str, ours: str, first: int) -> list[tuple[str, str]]:
    return [
        (f"{descript}.{first + unit}.block.{j}", f"{ours}.res_unit{unit + 1}.{name}")
        for unit in range(3)
        for j, name in enumerate(_RESIDUAL_UNIT)
    ]


def _dac_sizes(keys: list[str], encoder: str, decoder: str) -> tuple[int, int, int]:
    """(encoder blocks, decoder blocks, quantizers): distinct indices matching each pattern in ``keys``."""

    def count(pattern: str) -> int:
        return len({m.group(1) for k in keys if (m := re.match(pattern, k))})

    return count(encoder), count(decoder), count(r"quantizer\.quantizers\.(\d+)\.")


def _split_param(key: str) -> tuple[str, str]:
    """``a.b.conv1.parametrizations.weight.original0`` -> (``a.b.conv1``, ``parametrizations.weight.original0``)."""
    for suffix in _NORM_SUFFIXES:
        if key.endswith("." + suffix):
            return key[: -len(suffix) - 1], suffix
    module, _, param = key.rpartition(".")
    return module, param


def _fold(group: dict[str, torch.Tensor], module: str) -> State:
    """One module's tensors -> plain ``weight``/``bias``/``alpha`` (weight norm folded in)."""
    out = {p: t for p, t in group.items() if p not in _NORM_SUFFIXES}
    parts = {_NORM_SUFFIXES[p]: t for p, t in group.items() if p in _NORM_SUFFIXES}
    if parts:
        if set(parts) != {"g", "v"}:
            raise UpstreamKeyError(f"DAC module {module!r} has only part of its weight norm: {sorted(group)}")
        v = parts["v"].float()
        out["weight"] = (v * (parts["g"].float() / torch.norm_except_dim(v, 2, 0))).to(parts["v"].dtype)
    return out


def dac_state_from_upstream(audio: Mapping[str, torch.Tensor]) -> State:
    """``audio_encoder.*`` tensors (descript or DacModel layout) -> DacModel state dict (plain weights)."""
    if not audio:
        return {}
    descript = all(k.startswith(DESCRIPT) for k in audio)
    prefix = DESCRIPT if descript else AUDIO
    keys = [k.removeprefix(prefix) for k in audio]
    if descript:
        # blocks are the Sequential entries that hold a Sequential themselves (convs and snakes do not)
        sizes = _dac_sizes(keys, r"encoder\.block\.(\d+)\.block\.", r"decoder\.model\.(\d+)\.block\.")
        rename = dict(_dac_module_pairs(*sizes))
    else:
        sizes = _dac_sizes(keys, r"encoder\.block\.(\d+)\.", r"decoder\.block\.(\d+)\.")
        rename = {hf: hf for _, hf in _dac_module_pairs(*sizes)}
    groups: dict[str, dict[str, torch.Tensor]] = {}
    unknown = []
    for key, value in audio.items():
        module, param = _split_param(key.removeprefix(prefix))
        if module not in rename:
            unknown.append(key)
            continue
        groups.setdefault(rename[module], {})[param] = value
    if unknown:
        raise UpstreamKeyError(f"unknown DAC keys {_few(sorted(unknown))}: expected descript or DacModel names")
    return {f"{module}.{p}": t for module, group in groups.items() for p, t in _fold(group, module).items()}


def dac_state_to_upstream(
    dac: Mapping[str, torch.Tensor], layout: str = "descript", weight_norm: str = "parametrizations"
) -> State:
    """DacModel state dict -> upstream ``audio_encoder.*`` names (see :func:`to_upstream_state`)."""
    if layout == "transformers":
        return {AUDIO + k: v for k, v in dac.items()}
    if layout != "descript" or weight_norm not in ("parametrizations", "legacy"):
        raise ValueError(
            f"dac layout {layout!r} / weight_norm {weight_norm!r}: use layout 'descript' or 'transformers', "
            "weight_norm 'parametrizations' or 'legacy'"
        )
    keys = list(dac)
    sizes = _dac_sizes(keys, r"encoder\.block\.(\d+)\.", r"decoder\.block\.(\d+)\.")
    rename = {hf: descript for descript, hf in _dac_module_pairs(*sizes)}
    g_name, v_name = ("parametrizations.weight.original0", "parametrizations.weight.original1")
    if weight_norm == "legacy":
        g_name, v_name = "weight_g", "weight_v"
    out: State = {}
    for key, value in dac.items():
        module, param = _split_param(key)
        if module not in rename:
            raise UpstreamKeyError(f"unknown DacModel key {key!r}")
        name = DESCRIPT + rename[module]
        if param == "weight" and not module.endswith("codebook"):  # every conv is weight-normed upstream
            # g = ||w|| with the same norm the fold divides by: folding back gives w bit for bit
            out[f"{name}.{g_name}"] = torch.norm_except_dim(value.float(), 2, 0).to(value.dtype)
            out[f"{name}.{v_name}"] = value
        else:
            out[f"{name}.{param}"] = value
    return out
