"""QLoRA: ``train.lora.base_bits`` quantises the frozen base under the LoRA adapters with bitsandbytes — NF4 with
double quantisation (``Linear4bit``: 4-bit codes, one 8-bit absmax per 64 weights, one fp32 absmax per 256 of
those) for 4, LLM.int8 (``Linear8bitLt``: int8 rows with an fp32 scale each) for 8.

What is quantised: every ``torch.nn.Linear`` inside the family's layer units (:meth:`FamilyModel.fsdp_layer_classes`:
the decoder layers, where nearly all the parameters are) whose parameters are all frozen and not shared with
another module. Left in their dtype: the adapters and whatever trains in full (they train), the embeddings and
the output head (tied to the embeddings in Llama-3.2, and the loss reads the head's weight directly), the
frozen parts outside the layers (audio tokenizers, connectors: small, and their outputs feed every position),
and the Linears a transformers model keeps in float (``_keep_in_fp32_modules``: T5's ``wo``, which casts its
input to its weight's dtype, as transformers' own bitsandbytes loading does).

The quantised weights are a pure function of the base weights (bitsandbytes' quantisation is deterministic):
each session quantises the base it rebuilds from its source (``model.init_from`` or the seeded random init,
checked by its hash before), so checkpoints never hold quantised weights and a resumed run computes on the same
base bit for bit. bitsandbytes is imported lazily; without it the error names ``pip install voxrelay[bnb]``.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import TYPE_CHECKING

from voxrelay.config import ConfigError

if TYPE_CHECKING:
    import torch

    from voxrelay.models.base import FamilyModel

log = logging.getLogger(__name__)

NF4_BLOCK = 64  # bitsandbytes' default blocksize for 4-bit weights: one absmax per 64 weights
NESTED_BLOCK = 256  # double quantisation: the absmaxes quantised to 8 bits in blocks of 256
_PEFT_OWN = {"modules_to_save"}  # peft's trained copies (beside the frozen original_module)
OUTLIER_THRESHOLD = 6.0  # LLM.int8's default (transformers' llm_int8_threshold): outlier columns in 16-bit


class QuantisationError(ConfigError):
    """``train.lora.base_bits`` cannot be applied here (bitsandbytes missing)."""


def require_bitsandbytes(bits: int) -> None:
    """Raise :class:`QuantisationError` naming the install command when bitsandbytes cannot be imported."""
    try:
        import bitsandbytes  # noqa: F401
    except ImportError as e:
        raise QuantisationError(
            f"train.lora.base_bits={bits} quantises the base with bitsandbytes, which is not installed ({e}); "
            "install it with `pip install voxrelay[bnb]`, or set train.lora.base_bits=null for a base in its dtype"
        ) from None


def compute_dtype(mixed_precision: str) -> torch.dtype | None:
    """The dtype the quantised layers compute in under accelerate's ``mixed_precision`` (None under ``no``: the
    dtype of their input, i.e. of the weights)."""
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(mixed_precision)


def frozen_linears(module: torch.nn.Module, layer_classes: tuple[type, ...]) -> list[tuple[torch.nn.Module, str]]:
    """(parent, child name) of each Linear :func:`quantise_base` quantises (see the module docstring)."""
    import torch

    uses = Counter(id(p) for _, p in module.named_parameters(remove_duplicate=False))
    # what a transformers model says must stay in float (T5's `wo`: it casts its input to that weight's dtype)
    keep = {name for m in module.modules() for name in getattr(m, "_keep_in_fp32_modules", None) or ()}
    found, seen = [], set()
    for layer in module.modules():
        if not (layer_classes and isinstance(layer, layer_classes)):
            continue
        for path, parent in layer.named_modules():
            if _PEFT_OWN & set(path.split(".")) or any(part.startswith("lora_") for part in path.split(".")):
                continue  # the adapters and the trained copies: frozen too once loaded for inference
            for name, child in parent.named_children():
                if type(child) is not torch.nn.Linear or id(child) in seen or name in keep:
                    continue
                params = list(child.parameters())
                if any(p.requires_grad for p in params) or any(uses[id(p)] > 1 for p in params):
                    continue
                seen.add(id(child))
                found.append((parent, name))
    return found


def quantise_base(model: FamilyModel, bits: int, compute_dtype: torch.dtype | None) -> None:
    """Replace the frozen Linears of ``model.module`` (after LoRA: the adapters' base layers among them) by
    bitsandbytes' quantised ones, computing in ``compute_dtype``. On a GPU the weights are quantised there
    (seconds for 3B weights, ~1 min on CPU); :func:`dequantise_base` undoes it for a merged export."""
    import torch

    require_bitsandbytes(bits)
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    targets = frozen_linears(model.module, model.fsdp_layer_classes())
    before = sum(p.numel() * p.element_size() for p in model.module.parameters())
    for parent, name in targets:
        setattr(parent, name, _quantised(getattr(parent, name), bits, compute_dtype, device))
    after = sum(p.numel() * p.element_size() for p in model.module.parameters())
    log.info("QLoRA: %d frozen Linears of the %s model quantised to %s (parameters %.2f GB -> %.2f GB)",
             len(targets), model.family, "NF4 (double quantisation)" if bits == 4 else "int8", before / 1e9,
             after / 1e9)


def _quantised(linear: torch.nn.Linear, bits: int, compute_dtype: torch.dtype | None, device: torch.device):
    import bitsandbytes as bnb

    weight = linear.weight.data.to(device)
    if bits == 4:
        q = bnb.nn.Linear4bit(linear.in_features, linear.out_features, bias=False, compute_dtype=compute_dtype,
                              compress_statistics=True, quant_type="nf4", device="meta")
        q.weight = bnb.nn.Params4bit(weight, requires_grad=False, compress_statistics=True, quant_type="nf4",
                                     blocksize=NF4_BLOCK).to(device)
        # on a CPU with AVX512-BF16, bitsandbytes repacks a 4-bit weight for its inference kernel at the first
        # forward in eval mode, rounding the absmax to bf16 in place: evaluation would change the base that
        # training goes on with (and fails for layers narrower than 64). Off: eval computes as training does
        q.support_avx512bf16_for_cpu = False
    else:
        q = bnb.nn.Linear8bitLt(linear.in_features, linear.out_features, bias=False, has_fp16_weights=False,
                                threshold=OUTLIER_THRESHOLD, device="meta")
        q.weight = bnb.nn.Int8Params(weight, requires_grad=False, has_fp16_weights=False).to(device)
    q.bias = linear.bias  # frozen, in its dtype
    q.base_dtype = linear.weight.dtype  # what dequantise_base gives back
    return q


def dequantise_base(module: torch.nn.Module) -> int:
    """Replace every bitsandbytes Linear of ``module`` by a ``torch.nn.Linear`` holding its dequantised weight in
    the base's dtype (what the adapters were trained on, so that peft can merge them); returns how many."""
    import torch

    try:
        import bitsandbytes as bnb
    except ImportError:
        return 0
    done = 0
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if not isinstance(child, (bnb.nn.Linear4bit, bnb.nn.Linear8bitLt)):
                continue
            dtype = getattr(child, "base_dtype", torch.float32)
            if isinstance(child, bnb.nn.Linear4bit):
                weight = bnb.functional.dequantize_4bit(child.weight.data, child.weight.quant_state)
            else:  # int8 rows and their absmax scale (moved to the layer's state by its first forward)
                scale = child.weight.SCB if child.weight.SCB is not None else child.state.SCB
                weight = child.weight.data.float() * scale.float()[:, None] / 127
            plain = torch.nn.Linear(child.in_features, child.out_features, bias=False, device="meta")
            plain.weight = torch.nn.Parameter(weight.to(dtype), requires_grad=False)
            plain.bias = child.bias
            setattr(parent, name, plain)
            done += 1
    return done
