"""The ``train`` section of a run config, and :func:`parse_duration` (``checkpoint`` uses it too).

Imported by :mod:`voxrelay.config`, so it must stay free of torch (``--help`` and ``config show`` import it).
"""

from __future__ import annotations

import re
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from voxrelay.config.fields import Section, switch_section
from voxrelay.models.lora_config import LoraConfig

_DURATION_RE = re.compile(r"^\s*(?:(\d+(?:\.\d+)?)h)?\s*(?:(\d+(?:\.\d+)?)m)?\s*(?:(\d+(?:\.\d+)?)s)?\s*$")


def parse_duration(value: str | float | int | None) -> float | None:
    """``"23h30m"``, ``"90s"``, ``"15m"`` or a number of seconds -> seconds (float)."""
    if value is None or isinstance(value, int | float):
        return None if value is None else float(value)
    m = _DURATION_RE.match(value)
    if not m or not any(m.groups()):
        raise ValueError(f"{value!r} is not a duration; write e.g. '23h30m', '15m', '90s' or seconds as a number")
    h, mi, s = (float(g) if g else 0.0 for g in m.groups())
    return h * 3600 + mi * 60 + s


class TrainConfig(Section):
    # keys added with a default other than what runs did before them: the value a saved config without the key
    # stands for (so resuming such a run keeps what it started with, see voxrelay.train.optim.started_schedule)
    ADDED_WITH_NEW_BEHAVIOUR: ClassVar[dict[str, object]] = {"warmup_from_zero": False, "chunked_loss": False,
                                                                 "packing": False}
    # keys whose default changed: the old default, which a saved config holds when its run did not set the key
    CHANGED_DEFAULTS: ClassVar[dict[str, object]] = {"min_lr_ratio": 0.1, "precision": "no"}

    seed: int = Field(0, description="Seed of init, batch order and sampling")
    max_steps: int = Field(300, gt=0, description="Optimizer steps of the run")
    batch_seconds: float | None = Field(
        None, gt=0, description="Budget per batch in seconds of audio (set this or batch_tokens)"
    )
    batch_tokens: int | None = Field(
        6000, gt=0, description="Budget per batch in tokens (set this or batch_seconds): with packing the "
        "examples' tokens, else incl. padding"
    )
    kernels: Literal["auto", "plain"] = Field(
        "auto", description="auto: on CUDA with `pip install 'voxrelay[kernels]'`, Liger-Kernel's fused Triton "
        "RMSNorm and SwiGLU in the decoder layers (the run's first lines say which); plain: transformers' own. May "
        "be switched between sessions",
    )
    compile: bool = Field(
        False, description="torch.compile each decoder layer (regional: compiled once, reused by every layer; the "
        "first steps take longer). Needs a C compiler (and triton on a GPU). May be switched between sessions",
    )
    packing: bool | Literal["auto"] = Field(
        "auto", description="Packed batches: a batch's examples end to end in one row, no padding, each with its "
        "own positions, attention kept within each example (flash-attention's varlen kernel on CUDA where "
        "installed, else SDPA example by example) and the same loss terms; batches are shuffled rows cut at the "
        "budget instead of length-sorted buckets. auto: on for the families that can pack (docs/training.md, "
        "Packed batches, says which), off for the others (the reason is logged); true refuses a family that cannot. "
        "Runs saved before this key keep false",
    )
    lr: float = Field(1e-3, gt=0, description="Peak learning rate")
    optimizer: Literal["adamw", "adamw_8bit", "lion", "lion_8bit", "adafactor"] = Field(
        "adamw", description="adamw: torch AdamW (its fused kernel on a GPU; 8 bytes of state per parameter); "
        "adamw_8bit: bitsandbytes AdamW8bit (~2 bytes; `pip install 'voxrelay[bnb]'`); lion: Lion, the sign of an "
        "interpolated momentum (4 bytes; wants lr 3-10x smaller and weight_decay 3-10x larger than AdamW, betas "
        "(0.9, 0.99)); lion_8bit: bitsandbytes Lion8bit (~1 byte); adafactor: transformers "
        "Adafactor with this lr and schedule, factored second moments and no first moment (least memory; betas "
        "and eps do not apply)",
    )
    betas: tuple[float, float] = Field((0.9, 0.95), description="adamw/lion (and 8-bit): (beta1, beta2), each in "
                                       "[0, 1)")
    eps: float = Field(1e-8, gt=0, description="adamw/adamw_8bit: term added to the denominator")
    schedule: Literal["cosine", "linear", "constant", "constant_with_warmup"] = Field(
        "cosine", description="LR schedule, equal to HF transformers' get_scheduler of the same name: cosine / "
        "linear: warmup, then decay to min_lr_ratio x lr (0: HF's) at max_steps; constant: lr from step 0, NO "
        "warmup; constant_with_warmup",
    )
    min_lr_ratio: float = Field(
        0.0, ge=0, le=1, description="cosine/linear: final lr as a fraction of lr; 0 is HF's cosine/linear, cosine "
        "with 0.1 is HF's cosine_with_min_lr (min_lr_rate=0.1). Runs saved when the default was 0.1 keep 0.1",
    )
    warmup_steps: int = Field(20, ge=0, description="Linear warmup steps (all schedules but constant)")
    warmup_from_zero: bool = Field(
        True, description="Warmup as HF's: lr x step / warmup_steps, so the first step has lr 0; false: lr x "
        "(step + 1) / (warmup_steps + 1), the first step already trains (what runs saved before this key had)",
    )
    weight_decay: float = Field(
        0.01, ge=0, description="Decoupled weight decay of weight matrices (norms, biases and other 1-d parameters: 0)"
    )
    decay_norms_and_biases: bool = Field(
        False, description="Also decay norms, biases and other 1-d parameters (one group, as voxrelay did before "
        "0.2 and the demo still does); false: they get no weight decay, the usual practice",
    )
    precision: Literal["auto", "no", "bf16", "fp16"] = Field(
        "auto", description="Mixed precision (accelerate). auto: bf16 on a card with native bf16 (A100, L4, A10G, "
        "RTX 3090/4090, L40S, H100), fp16 with a loss scaler on one without (T4, V100; fp32 under fsdp there), fp32 "
        "on CPU; the run records what it resolved to and keeps it on resume. Runs saved before auto keep no (fp32)",
    )
    grad_accum: int = Field(1, gt=0, description="Micro-batches per optimizer step")
    shuffle_window: int = Field(
        64, ge=0, description="Shards per shuffle window: each epoch shuffles the shard order, cuts it into windows "
        "of this many shards and buckets and shuffles the rows of each window on their own, so a stretch of "
        "batches reads a window's shards only (what streaming from a bucket caches); 0, or at least as many "
        "shards as the split has, shuffles all rows together",
    )
    prefetch_batches: int = Field(
        2, ge=0, description="Batches a background thread builds ahead of the loop (fetching shards, tokenising, "
        "collating, pinning memory); 0 builds each on the training thread",
    )
    clip_norm: float | None = Field(1.0, gt=0, description="Gradient clipping max norm (None = off)")
    eval_every: int = Field(100, gt=0, description="Steps between evaluations")
    eval_synth: int = Field(
        4, ge=0, description="Held-out texts synthesised and scored per eval (MCD-DTW; with eval.asr WER/CER, with "
        "eval.speaker_similarity speaker similarity)",
    )
    log_every: int = Field(10, gt=0, description="Steps between metric lines")
    time_limit: str | None = Field(
        None,
        description="Per session: save and exit (code 77) this long after the session started (the process's "
        "start, imports included, or the machine's boot: train.time_limit_from), e.g. '23h30m' a little under a "
        "Colab session; the next session gets the same again",
    )
    time_limit_from: Literal["process", "boot"] = Field(
        "process", description="What train.time_limit counts from: process (this process's start) or boot (the "
        "machine's: on Colab the runtime's start, so time spent in earlier cells counts too)",
    )
    total_time_limit: str | None = Field(
        None, description="Budget over all sessions of the run: save and exit (code 77) once the training time "
        "of every session together reaches it (None = no budget)",
    )
    max_bad_steps: int = Field(
        20, gt=0, description="Consecutive non-finite (NaN/inf) steps (each skipped) after which the run saves "
        "and stops with exit code 78",
    )
    early_stopping_patience: int | None = Field(
        None, gt=0, description="Stop when the eval loss has not improved for this many evaluations (None = off)"
    )
    strategy: Literal["ddp", "fsdp"] = Field(
        "ddp", description="ddp: every process holds the whole model (accelerate DDP); fsdp: parameters, gradients and "
        "optimizer states sharded over the processes (FSDP2 fully_shard per decoder layer), checkpoints saved as "
        "per-rank shards (torch.distributed.checkpoint). `accelerate launch` with an FSDP config sets it too",
    )
    fsdp_sharding: Literal["full_shard", "shard_grad_op", "hybrid"] = Field(
        "full_shard", description="fsdp: full_shard frees gathered layers after forward (least memory); shard_grad_op "
        "keeps them until backward (less communication); hybrid shards within a node, replicates across nodes",
    )
    gradient_checkpointing: bool = Field(
        False, description="Recompute each layer's activations in backward instead of keeping them (less memory, "
        "~30% more compute); with ddp, fsdp and LoRA",
    )
    activation_offload: bool = Field(
        False, description="With gradient_checkpointing: keep each checkpointed layer's input (the residual stream "
        "at every layer boundary, layers x tokens x hidden) in host memory, pinned on CUDA, and bring it back for "
        "the layer's recompute in backward (frees that much GPU memory; costs a copy each way per layer); with "
        "ddp, fsdp and LoRA",
    )
    cpu_offload: bool = Field(False, description="fsdp: keep parameters, gradients and optimizer states in CPU memory")
    chunked_loss: bool = Field(
        True, description="The output head's cross-entropy a chunk of tokens at a time, never holding the logits of "
        "every token (Orpheus: 156,940 per token; the plan's `logits` column); on CUDA with `pip install "
        "'voxrelay[kernels]'` Liger-Kernel's fused kernel. Equal to the materialised loss to float rounding, not "
        "bit for bit; false: the logits materialised, as runs saved before this key keep. For families whose loss "
        "is one head over a vocabulary; under train.strategy=fsdp the logits stay materialised",
    )
    loss_chunk_tokens: int = Field(
        256, gt=0, description="chunked_loss: tokens per chunk (the chunk's logits take 4 bytes x vocabulary each; "
        "fewer tokens, less memory and smaller matmuls)",
    )
    ignore_plan: bool = Field(
        False, description="On a GPU, train checks its strategy against `voxrelay plan` before loading weights and "
        "stops (exit 2, with the plan) when it will not fit; true: warn and try anyway",
    )
    lora: LoraConfig | None = Field(
        None, description="null: full fine-tune. A section (`{}` or `true` for the family's defaults) trains LoRA "
        "adapters on a frozen base model; checkpoints then hold the adapters and modules_to_save only",
    )

    @field_validator("lora", mode="before")
    @classmethod
    def _lora(cls, v: Any) -> Any:
        return switch_section(v)  # true: LoRA with the family's defaults; false: off

    @field_validator("precision", mode="before")
    @classmethod
    def _precision(cls, v: Any) -> Any:
        return "no" if v is False else v  # YAML reads a bare `no` as false

    @field_validator("betas")
    @classmethod
    def _betas(cls, v: tuple[float, float]) -> tuple[float, float]:
        if not all(0 <= b < 1 for b in v):
            raise ValueError(f"betas {list(v)} must each be in [0, 1), e.g. [0.9, 0.95]")
        return v

    @field_validator("time_limit", "total_time_limit")
    @classmethod
    def _time_limit(cls, v: str | None) -> str | None:
        parse_duration(v)
        return v

    @model_validator(mode="after")
    def _strategy(self) -> TrainConfig:
        if self.cpu_offload and self.strategy != "fsdp":
            raise ValueError("train.cpu_offload=true needs train.strategy=fsdp (ddp keeps the whole model on each "
                             "GPU); set train.strategy=fsdp or train.cpu_offload=false")
        if self.activation_offload and not self.gradient_checkpointing:
            # without checkpointing every tensor each layer saves would cross to the host and back (~13x the
            # bytes of the layer inputs at Llama-3B width): too slow to be worth it, so it is not offered
            raise ValueError("train.activation_offload=true moves the layer inputs gradient checkpointing keeps, so "
                             "it needs train.gradient_checkpointing=true; set it, or train.activation_offload=false")
        if self.strategy == "fsdp" and self.optimizer.endswith("_8bit"):
            full = self.optimizer.removesuffix("_8bit")
            raise ValueError(f"train.optimizer={self.optimizer} does not work under train.strategy=fsdp (bitsandbytes' "
                             f"8-bit step gets FSDP2's sharded DTensors and fails); use train.optimizer={full} with "
                             f"fsdp (or cpu_offload=true for the states), or {self.optimizer} with train.strategy=ddp")
        if self.strategy == "fsdp" and self.lora is not None and self.lora.base_bits:
            raise ValueError(f"train.lora.base_bits={self.lora.base_bits} does not work under train.strategy=fsdp "
                             "(FSDP2 shards parameters into DTensors, which drop bitsandbytes' quantisation state); "
                             "use train.strategy=ddp with base_bits, or train.lora.base_bits=null with fsdp")
        if self.strategy == "fsdp" and self.precision == "fp16":
            raise ValueError("train.strategy=fsdp trains in bf16 or fp32 (fp16 needs a loss scaler over sharded "
                             "gradients); set train.precision=bf16 or no")
        return self

    @model_validator(mode="after")
    def _budget(self) -> TrainConfig:
        if (self.batch_seconds is None) == (self.batch_tokens is None):
            raise ValueError(
                "set exactly one of batch_seconds or batch_tokens (the other to null), "
                f"got batch_seconds={self.batch_seconds}, batch_tokens={self.batch_tokens}"
            )
        return self
