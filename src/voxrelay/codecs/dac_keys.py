"""DAC weight names: descript's (Parler-TTS' ``DACModel`` wrapper, the hub's ``…/dac_44khZ_8kbps``, and the
``audio_encoder`` of every Parler-TTS checkpoint) <-> transformers' ``DacModel``.

Descript's modules are ``nn.Sequential`` indices under ``model.{encoder,decoder,quantizer}``, with weight-normed
convs stored as ``weight_g/weight_v`` or ``parametrizations.weight.original0/1``; DacModel (transformers 5) has
named modules and plain ``weight`` tensors: weight norm is folded in, ``w = g * v / ||v||`` with the norm over
every dim but 0, as ``torch.nn.utils.weight_norm(dim=0)`` computes it (and back, bit for bit).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from transformers import DacConfig

State = dict[str, torch.Tensor]

AUDIO = "audio_encoder."
DESCRIPT = "audio_encoder.model."
_NORM_SUFFIXES = {  # weight-norm storage -> (magnitude g, direction v)
    "weight_g": "g",
    "weight_v": "v",
    "parametrizations.weight.original0": "g",
    "parametrizations.weight.original1": "v",
}
_RESIDUAL_UNIT = ("snake1", "conv1", "snake2", "conv2")


class KeyMapError(ValueError):
    """A state dict holds names a key map does not know (or lacks ones the model needs)."""


def _few(keys: list[str], limit: int = 8) -> str:
    return str(keys[:limit]) + (f" (+{len(keys) - limit} more)" if len(keys) > limit else "")


def is_descript_config(config: Mapping[str, Any]) -> bool:
    """True for Parler-TTS' ``DACConfig`` (``num_codebooks``, ``latent_dim``; ``model_type`` "dac" or
    "dac_on_the_hub"), False for transformers' ``DacConfig`` (``n_codebooks``, ``encoder_hidden_size``)."""
    return "n_codebooks" not in config and "encoder_hidden_size" not in config and (
        "num_codebooks" in config or "latent_dim" in config)


def dac_config_from_upstream(audio_encoder: Mapping[str, Any]) -> DacConfig:
    """transformers ``DacConfig`` for a DAC config dict: Parler-TTS' descript wrapper (both spellings) or DacModel's.

    Parler-TTS' carries ``frame_rate`` (86), which transformers' DacConfig computes itself (a read-only 87 =
    ceil(44100 / 512)): it is never passed on."""
    from transformers import DacConfig

    if not is_descript_config(audio_encoder):  # e.g. mini v1.1: already a transformers DacConfig
        return DacConfig.from_dict({k: v for k, v in audio_encoder.items() if k not in ("frame_rate", "model_type")})
    return DacConfig(
        **DESCRIPT_LAYOUT,
        n_codebooks=int(audio_encoder.get("num_codebooks", 9)),
        codebook_size=int(audio_encoder.get("codebook_size", 1024)),
        hidden_size=int(audio_encoder.get("latent_dim", 1024)),
        sampling_rate=int(audio_encoder.get("sampling_rate", 44100)),
    )


# descript's DAC(...) defaults (its 44.1 kHz model): upstream's DACModel builds exactly these, taking only
# num_codebooks, latent_dim and codebook_size from its config
DESCRIPT_LAYOUT: dict[str, Any] = dict(encoder_hidden_size=64, downsampling_ratios=[2, 4, 8, 8],
                                       decoder_hidden_size=1536, upsampling_ratios=[8, 8, 4, 2], codebook_dim=8,
                                       hop_length=512)
DESCRIPT_RATE = 44100


def descript_layout_differences(config: DacConfig) -> dict[str, tuple[Any, Any]]:
    """{size: (this DAC's, descript's)} where ``config`` differs from the DAC upstream's wrapper builds (empty: the
    DAC can be written as ``dac_on_the_hub``)."""
    ours = {k: getattr(config, k) for k in DESCRIPT_LAYOUT} | {"sampling_rate": config.sampling_rate}
    ours = {k: list(v) if isinstance(v, tuple) else v for k, v in ours.items()}
    return {k: (ours[k], v) for k, v in (DESCRIPT_LAYOUT | {"sampling_rate": DESCRIPT_RATE}).items() if ours[k] != v}


# transformers' DacConfig fields (4.46, upstream's, and 5): what an audio_encoder of model_type "dac" holds
TRANSFORMERS_DAC_FIELDS = ("encoder_hidden_size", "downsampling_ratios", "decoder_hidden_size", "upsampling_ratios",
                           "n_codebooks", "codebook_size", "codebook_dim", "quantizer_dropout", "hidden_size",
                           "hop_length", "commitment_loss_weight", "codebook_loss_weight", "sampling_rate")


def transformers_dac_config(config: DacConfig) -> dict[str, Any]:
    """``config`` as the ``audio_encoder`` dict of a model whose DAC is transformers' ``DacModel`` (as Parler-TTS
    mini v1.1 ships it): only DacConfig's own fields, every size explicit."""
    out = {k: getattr(config, k) for k in TRANSFORMERS_DAC_FIELDS}
    return {k: list(v) if isinstance(v, tuple) else v for k, v in out.items()} | {"model_type": "dac"}


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
            raise KeyMapError(f"DAC module {module!r} has only part of its weight norm: {sorted(group)}")
        v = parts["v"].float()
        out["weight"] = (v * (parts["g"].float() / torch.norm_except_dim(v, 2, 0))).to(parts["v"].dtype)
    return out


def dac_state_from_upstream(audio: Mapping[str, torch.Tensor], prefix: str = AUDIO) -> State:
    """``prefix``-ed DAC tensors -> DacModel state dict (plain weights). ``prefix`` "audio_encoder." for a Parler
    model's state, "" for a DAC folder's own; under it, descript's wrapper (``model.encoder.block…``, weight-normed)
    or DacModel's names."""
    if not audio:
        return {}
    descript = all(k.startswith(prefix + "model.") for k in audio)
    prefix = prefix + "model." if descript else prefix
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
        raise KeyMapError(f"unknown DAC keys {_few(sorted(unknown))}: expected descript or DacModel names")
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
            raise KeyMapError(f"unknown DacModel key {key!r}")
        name = DESCRIPT + rename[module]
        if param == "weight" and not module.endswith("codebook"):  # every conv is weight-normed upstream
            # g = ||w|| with the same norm the fold divides by: folding back gives w bit for bit
            out[f"{name}.{g_name}"] = torch.norm_except_dim(value.float(), 2, 0).to(value.dtype)
            out[f"{name}.{v_name}"] = value
        else:
            out[f"{name}.{param}"] = value
    return out
