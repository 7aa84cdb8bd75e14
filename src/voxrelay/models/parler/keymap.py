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

from collections.abc import Mapping
from dataclasses import Field, fields
from pathlib import Path
from typing import Any

import torch

from voxrelay.codecs.dac_keys import (  # noqa: F401 (re-exported: the family's key map includes the DAC's)
    AUDIO,
    DESCRIPT,
    KeyMapError,
    dac_config_from_upstream,
    dac_state_from_upstream,
    dac_state_to_upstream,
)
from voxrelay.hf_weights import read_weights
from voxrelay.models.parler.modeling import ParlerConfig, ParlerDecoderConfig, build_parler, sinusoid_table

State = dict[str, torch.Tensor]

TIED_T5 = "text_encoder.encoder.embed_tokens.weight"
DECODER_POSITIONS = "decoder.model.decoder.embed_positions.weights"
FUSED_HEADS = "decoder.lm_heads.weight"
_WRAPPERS = ("module.", "_orig_mod.")  # DDP / torch.compile prefixes in training checkpoints


UpstreamKeyError = KeyMapError  # one error for every name the key map refuses, the DAC's included


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


def read_upstream_state(folder: str | Path) -> State:
    """All tensors of an upstream folder: ``model.safetensors`` (or its shards), or the pickled
    ``pytorch_model.bin`` of an accelerate ``checkpoint-*`` folder (read with ``weights_only=True``)."""
    return read_weights(folder)


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
