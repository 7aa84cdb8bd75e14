"""The ``train.lora`` section of a run config (used by :mod:`voxrelay.train.strategies`).

Imported by :mod:`voxrelay.config`, so it must stay free of torch/peft (``--help`` and ``config show``
import it).
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

# ``model.weights_dtype`` of the families that load pretrained weights
WeightsDtype = Literal["auto", "float32", "bfloat16", "float16"]
WEIGHTS_DTYPE_HELP = (
    "Dtype the weights are loaded in. auto: under train.lora the frozen base in the compute dtype "
    "(train.precision bf16 -> bfloat16, fp16 -> float16, no -> float32; what trains stays float32), else float32 "
    "master weights; float32 / bfloat16 / float16 as named. Runs saved when the default was float32 keep float32"
)
# train.precision=auto is resolved before a run builds its model (voxrelay.precision); only `plan` sees it unresolved,
# and it prices a GPU, where auto computes in bf16 or fp16: 2 bytes either way
COMPUTE_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "no": "float32", "auto": "bfloat16"}


def resolve_weights_dtype(value: str, precision: str, lora: bool) -> str:
    """``model.weights_dtype`` as loaded: ``auto`` is the compute dtype of ``train.precision`` for a LoRA base (it
    never trains: fp32 would only hold bits the compute drops), float32 for weights that train (master weights)."""
    if value != "auto":
        return value
    return COMPUTE_DTYPES.get(precision, "float32") if lora else "float32"


class LoraConfig(BaseModel):
    """``train.lora``: low-rank adapters (peft) on the family's layers instead of a full fine-tune.

    Every key left unset (None) takes the model family's default (``FamilyModel.lora_defaults``)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
    # keys added with a default other than what runs did before them: the value a saved config without the key
    # stands for (a resumed run keeps it unless this session's config sets the key, see voxrelay.train.build)
    ADDED_WITH_NEW_BEHAVIOUR: ClassVar[dict[str, object]] = {"embeddings": "full"}

    r: int | None = Field(None, gt=0, description="Rank of the adapters (None = the family's default)")
    alpha: float | None = Field(
        None, gt=0, description="Scale numerator: updates are scaled by alpha/r, or alpha/sqrt(r) with rslora "
        "(None = the family's default)",
    )
    dropout: float | None = Field(
        None, ge=0, lt=1, description="Dropout on the adapters' input (None = the family's default)"
    )
    rslora: bool | None = Field(
        None, description="Rank-stabilised scaling alpha/sqrt(r) instead of alpha/r (None = the family's default)"
    )
    target_modules: list[str] | str | None = Field(
        None, description="Module names that get adapters, a regex over full module names, or 'all-linear' "
        "(None = the family's default)",
    )
    modules_to_save: list[str] | None = Field(
        None, description="Modules trained in full beside the adapters (e.g. VibeVoice's diffusion head); [] for "
        "none (None = the family's default)",
    )
    embeddings: Literal["new_rows", "full"] = Field(
        "new_rows", description="The input embeddings and output head of a family whose vocabulary gets tokens "
        "(Orpheus from a plain Llama-3, codec_lm's audio ids): new_rows trains only the rows of the tokens the "
        "checkpoint lacked (peft's trainable_token_indices, in float32; none when it has them all); full trains "
        "both matrices in full (modules_to_save), what runs saved before this key did",
    )
    base_bits: Literal[4, 8] | None = Field(
        None, description="QLoRA: quantise the frozen base's layer Linears with bitsandbytes (`pip install "
        "voxrelay[bnb]`): 4 = NF4 with double quantisation (~0.52 bytes/weight), 8 = LLM.int8 (~1 byte/weight); "
        "re-quantised from the base each session, never stored in checkpoints; ddp only (not fsdp). null: the "
        "base in its dtype",
    )
