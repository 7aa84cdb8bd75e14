"""The ``model:`` section of a run config when ``model.family: csm``.

Imported by :mod:`voxrelay.config`, so it must stay free of torch/transformers (``--help`` and ``config show``
import it).
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from voxrelay.models.base import DataNeeds
from voxrelay.models.lora_config import WEIGHTS_DTYPE_HELP, WeightsDtype
from voxrelay.models.seam import FamilyConfig

RANDOM_ONLY = "Random init only"


class CsmConfig(FamilyConfig):
    """Sesame's Conversational Speech Model through transformers' ``CsmForConditionalGeneration``: a Llama backbone
    over text tokens and Mimi frames (the sum of a frame's codebook embeddings) that predicts a frame's first
    codebook, and a small depth decoder that predicts the others from the backbone's state. A training example is a
    turn of a conversation after up to ``context_turns`` previous turns (their text and audio); its speech is the
    target. Fine-tuning starts from ``init_from`` (e.g. sesame/csm-1b in transformers' layout); without it the model
    is random with the sizes below and ``tokenizer`` names a Llama-3 tokenizer."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    family: Literal["csm"] = Field(
        "csm", description="Model family (src/voxrelay/models/<family>/); the other model.* keys depend on it"
    )
    init_from: str | None = Field(
        None, description="Pretrained weights: local folder or hub id in transformers' layout (e.g. sesame/csm-1b); "
        "None = random",
    )
    tokenizer: str | None = Field(None, description="Llama-3 tokenizer folder or hub id (None = the one of init_from)")
    context_turns: int = Field(
        3, ge=0, description="Previous turns of a row's conversation (data `conversation`/`turn` columns) given as "
        "context, text and audio, nearest first, as many as model.max_seq_len leaves room for; 0: none",
    )
    train_context: bool = Field(
        False, description="Also learn the context turns' speech (transformers' processor labels every turn); false: "
        "each row's own turn only, so every turn is a target once per epoch",
    )
    depth_decoder_frames: float = Field(
        1 / 16, gt=0, le=1, description="Share of a target's frames the depth decoder learns at each step (the CSM "
        "paper's compute amortisation: 1/16), drawn anew every step by a seeded generator; the end-of-audio frame "
        "always; the backbone learns every frame",
    )
    max_seq_len: int = Field(2048, gt=0, description="Longest training sequence: text tokens + audio frames, context "
                             "included (csm-1b: 2048)")
    dropout: float = Field(0.0, ge=0, lt=1, description="Attention dropout of the backbone and depth decoder")
    weights_dtype: WeightsDtype = Field("auto", description=WEIGHTS_DTYPE_HELP)
    hidden_size: int = Field(2048, gt=0, description=f"{RANDOM_ONLY}: backbone width (csm-1b: 2048)")
    num_layers: int = Field(16, gt=0, description=f"{RANDOM_ONLY}: backbone layers (csm-1b: 16)")
    num_heads: int = Field(32, gt=0, description=f"{RANDOM_ONLY}: backbone attention heads (csm-1b: 32)")
    num_kv_heads: int = Field(8, gt=0, description=f"{RANDOM_ONLY}: backbone key/value heads (csm-1b: 8)")
    intermediate_size: int = Field(8192, gt=0, description=f"{RANDOM_ONLY}: backbone MLP width (csm-1b: 8192)")
    depth_hidden_size: int = Field(1024, gt=0, description=f"{RANDOM_ONLY}: depth decoder width (csm-1b: 1024)")
    depth_layers: int = Field(4, gt=0, description=f"{RANDOM_ONLY}: depth decoder layers (csm-1b: 4)")
    depth_heads: int = Field(8, gt=0, description=f"{RANDOM_ONLY}: depth decoder heads (csm-1b: 8, 2 key/value)")
    depth_intermediate_size: int = Field(8192, gt=0, description=f"{RANDOM_ONLY}: depth decoder MLP width")

    @model_validator(mode="after")
    def _shapes(self) -> CsmConfig:
        if self.hidden_size % self.num_heads or self.num_heads % self.num_kv_heads:
            raise ValueError(f"hidden_size ({self.hidden_size}) must be divisible by num_heads ({self.num_heads}) "
                             f"and num_heads by num_kv_heads ({self.num_kv_heads})")
        if self.depth_hidden_size % self.depth_heads:
            raise ValueError(f"depth_hidden_size ({self.depth_hidden_size}) must be divisible by depth_heads "
                             f"({self.depth_heads})")
        return self

    def data_needs(self) -> DataNeeds:
        """Mimi codes (CSM's codec; codec.num_codebooks 32 for csm-1b, checked against the model when it is built),
        with each row's conversation and turn kept."""
        return DataNeeds(codec="mimi", conversations=True)
