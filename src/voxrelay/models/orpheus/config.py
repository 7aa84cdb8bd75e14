"""The ``model:`` section of a run config when ``model.family: orpheus``.

Imported by :mod:`voxrelay.config`, so it must stay free of torch/transformers (``--help`` and
``config show`` import it).
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import ConfigDict, Field, model_validator

from voxrelay.models.base import DataNeeds
from voxrelay.models.lora_config import WEIGHTS_DTYPE_HELP, WeightsDtype
from voxrelay.models.seam import FamilyConfig


class OrpheusConfig(FamilyConfig):
    """Orpheus-TTS (canopyai): a Llama-3 causal LM over ``[start_of_human, BOS, text, eot, end_of_human,
    start_of_ai, start_of_speech, SNAC codes (7 per frame), end_of_speech, end_of_ai]``, ids exactly as upstream.

    Fine-tuning starts from ``init_from`` (an Orpheus checkpoint keeps its audio tokens; a plain Llama-3
    checkpoint gets the 28,683 Orpheus tokens added). Without ``init_from`` the model is random with the
    sizes below (training from scratch) and ``tokenizer`` must name a Llama-3 tokenizer.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
    # keys whose default changed: the old default, which a saved config holds when its run did not set the key (a
    # resumed run keeps it unless this session's config sets the key, see voxrelay.train.build)
    CHANGED_DEFAULTS: ClassVar[dict[str, object]] = {"weights_dtype": "float32"}
    # keys added with a default other than what runs did before them: the value a saved config without the key
    # stands for (so resuming such a run with the new default is a change the resume check names)
    ADDED_WITH_NEW_BEHAVIOUR: ClassVar[dict[str, object]] = {"drop_duplicate_frames": False}

    family: Literal["orpheus"] = Field(
        "orpheus", description="Model family (src/voxrelay/models/<family>/); the other model.* keys depend on it"
    )
    init_from: str | None = Field(
        None, description="Pretrained weights: local folder or hub id, e.g. canopylabs/orpheus-3b-0.1-pretrained "
        "(Orpheus: its audio tokens are kept) or meta-llama/Llama-3.2-3B (Orpheus' tokens are added); None = random",
    )
    tokenizer: str | None = Field(
        None, description="Llama-3 (or Orpheus) tokenizer folder or hub id (None = the one of init_from)"
    )
    loss_on: Literal["all", "speech"] = Field(
        "all", description="all: loss on the whole sequence, prompt included (upstream Orpheus); speech: on the "
        "audio codes, end_of_speech and end_of_ai only",
    )
    drop_duplicate_frames: bool = Field(
        True, description="Leave out of each training example a SNAC frame whose first code repeats the previous "
        "frame's, as upstream's data preparation (remove_duplicate_frames); batch lengths are planned before "
        "(an upper bound). Runs saved before this key existed trained without it (false)",
    )
    max_seq_len: int = Field(4096, gt=0, description="Longest training sequence in tokens (text + 7 per SNAC frame)")
    dropout: float = Field(0.0, ge=0, lt=1, description="Attention dropout (upstream: 0)")
    weights_dtype: WeightsDtype = Field("auto", description=WEIGHTS_DTYPE_HELP)
    hidden_size: int = Field(3072, gt=0, description="Random init only: transformer width (Llama-3.2-3B: 3072)")
    num_layers: int = Field(28, gt=0, description="Random init only: transformer layers (Llama-3.2-3B: 28)")
    num_heads: int = Field(24, gt=0, description="Random init only: attention heads (Llama-3.2-3B: 24)")
    num_kv_heads: int = Field(8, gt=0, description="Random init only: key/value heads (Llama-3.2-3B: 8)")
    intermediate_size: int = Field(8192, gt=0, description="Random init only: MLP width (Llama-3.2-3B: 8192)")
    rope_theta: float = Field(500000.0, gt=0, description="Random init only: RoPE base (Llama-3: 500000)")

    @model_validator(mode="after")
    def _shapes(self) -> OrpheusConfig:
        if self.hidden_size % self.num_heads or self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be divisible by num_heads ({self.num_heads}) and num_heads "
                f"by num_kv_heads ({self.num_kv_heads})"
            )
        return self

    def data_needs(self) -> DataNeeds:
        """SNAC 24 kHz codes: Orpheus' ids hold 7 codes of 4,096 per frame (models/orpheus/layout.py)."""
        return DataNeeds(codes=(7, 4096), codec="snac")
