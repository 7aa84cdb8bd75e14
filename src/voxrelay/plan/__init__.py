"""``voxrelay plan``: memory per GPU of a run's model under each training strategy, before renting a GPU.

The model is built on the meta device through the family seam (shapes only: no weights read, only
config.json of ``model.init_from``), LoRA applied on meta too (peft works there), and every parameter's shape
and dtype feeds :mod:`voxrelay.plan.formulas`. Sequence lengths come from the prepared data (the longest
example, the 95th percentile, and the batch budget) or ``--seq-len``.

Assumptions (each also written where it is used):
- ``train.precision=bf16`` (or fp16) under DDP is accelerate's autocast over the weights as loaded
  (``model.weights_dtype``, ``auto`` by default: fp32 master weights, a LoRA base in the compute dtype); FSDP
  is FSDP2 with bf16 parameters in compute and fp32 gradient reduction (MixedPrecisionPolicy), sharded
  parameters/gradients/states in their own dtype.
- DDP over more than one GPU keeps a second copy of the gradients in its reducer's buckets.
- FSDP adds the largest unit (a decoder layer, or the root: embeddings + head) gathered in bf16 plus its
  unsharded fp32 gradient before reduce-scatter: 6 bytes per parameter of that unit.
- CPU offload (FSDP's CPUOffloadPolicy) keeps parameters, gradients and optimizer states in CPU memory.
- A micro-batch holds ``train.batch_tokens`` tokens (padding included, or examples packed end to end in one row
  with ``train.packing``: the same positions; one example longer than the budget makes a batch by itself);
  attention is SDPA, or SDPA example by example in a packed row (memory linear in tokens either way, attention
  FLOPs by the longest example's context).
- The total is the step's peak, not the sum of the columns: what stays (weights, optimizer states, DDP's
  buckets) plus the largest of the step's phases (:func:`phases`). Checked against the peak of live tensors
  on CPU and ``max_memory_allocated`` on an H200 (``bench/plan_accuracy.py``, ``tests/unit/test_plan.py``).
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from voxrelay.config import RunConfig
from voxrelay.errors import UserError
from voxrelay.plan.cards import CARDS, PROFILES
from voxrelay.plan.formulas import (
    FRAGMENTATION,
    GB,
    LOGITS_GRAD_PER_VOCAB,
    OVERHEAD_FIXED,
    UNFUSED_OPTIMIZERS,
    Param,
    Shape,
    activation_bytes,
    autocast_copies,
    chunked_logits_bytes,
    dequantised_bytes,
    grad_bytes,
    logits_bytes,
    offloaded_activation_bytes,
    optimizer_bytes,
    overhead_bytes,
    quantised_params,
    weight_bytes,
)

GIB = 2**30
# memory torch can use (torch.cuda.mem_get_info on an idle card), not the marketing size
GPU_PRESETS = {**{k: c.memory for k, c in CARDS.items()}, **{k: CARDS[p.card].memory for k, p in PROFILES.items()}}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(gb|gib|mb|mib)?\s*$", re.IGNORECASE)
_UNITS = {"gb": GB, "gib": GIB, "mb": 10**6, "mib": 2**20, None: GB}
# how unusual a choice is, for the recommendation (fewest GPUs first, then the least exotic)
_EXOTIC = {"gradient_checkpointing": 1, "adamw_8bit": 2, "fsdp": 2, "lora": 3, "cpu_offload": 4, "qlora": 2,
           "activation_offload": 4}


class PlanError(UserError, ValueError):
    """``voxrelay plan`` lacks what it needs (prepared data or --seq-len, a GPU size)."""


def parse_gpu_memory(value: str | None, gpu: str | None) -> int:
    """Bytes of one GPU from ``--gpu-memory 80GB`` (GB = 10**9 bytes, GiB = 2**30) or ``--gpu h100``."""
    if value and gpu:
        raise PlanError(f"--gpu-memory {value} and --gpu {gpu} both given; pass one of them")
    if gpu:
        if gpu.lower() not in GPU_PRESETS:
            raise PlanError(f"--gpu {gpu!r} is not known; use one of {', '.join(GPU_PRESETS)} or --gpu-memory 80GB")
        return int(GPU_PRESETS[gpu.lower()])
    m = _SIZE_RE.match(value or "80GB")
    if not m or float(m.group(1)) <= 0:
        raise PlanError(f"--gpu-memory {value!r} is not a size; write e.g. 80GB, 40GiB or 24000MB")
    unit = m.group(2).lower() if m.group(2) else None
    return int(float(m.group(1)) * _UNITS[unit])


def gpu_bf16(gpu: str | None) -> bool:
    """Whether ``--gpu NAME`` computes in bf16 natively (an unnamed GPU is assumed to: A100, L4, H100, ...)."""
    from voxrelay.plan.cards import card_named

    named = card_named(gpu) if gpu else None
    return True if named is None else named[0].bf16


def host_memory_of(value: str | None, gpu: str | None, this_machine: bool = True) -> int | None:
    """Bytes of RAM of one machine: ``--host-memory``, else a Colab profile's (``--gpu colab-t4``), else this
    machine's (``this_machine``), else None (not checked). :func:`host_source` says which."""
    from voxrelay.plan.cards import card_named
    from voxrelay.plan.host import this_machine as ram

    if value:
        m = _SIZE_RE.match(value)
        if not m:
            raise PlanError(f"--host-memory {value!r} is not a size; write e.g. 12.7GB, 64GiB or 52000MB")
        if float(m.group(1)) <= 0:
            raise PlanError(f"--host-memory {value!r} must be more than 0; write e.g. 12.7GB, 64GiB or 52000MB")
        return int(float(m.group(1)) * _UNITS[m.group(2).lower() if m.group(2) else None])
    named = card_named(gpu) if gpu else None
    if named and named[1] is not None:
        return named[1].host_memory
    return ram() if this_machine else None


def host_source(value: str | None, gpu: str | None) -> str:
    """Where :func:`host_memory_of` took the machine's RAM from, for the plan's header."""
    from voxrelay.plan.cards import PROFILES

    if value:
        return "--host-memory"
    key = (gpu or "").strip().lower()
    return f"{PROFILES[key].note}" if key in PROFILES else "this machine's; --host-memory GB for another"


@dataclass(frozen=True)
class Strategy:
    strategy: str  # ddp | fsdp
    gpus: int
    lora: bool
    optimizer: str
    cpu_offload: bool = False
    gradient_checkpointing: bool = False
    base_bits: int = 0  # QLoRA: the frozen base quantised to 4 or 8 bits (0: in its dtype)
    activation_offload: bool = False  # with gradient_checkpointing: the layer inputs it keeps in host memory

    @property
    def name(self) -> str:
        parts = [f"{self.strategy}x{self.gpus}", f"qlora{self.base_bits}" if self.base_bits else
                 "lora" if self.lora else "full"]
        parts += ["grad-ckpt"] * self.gradient_checkpointing + ["act-offload"] * self.activation_offload
        parts += ["offload"] * self.cpu_offload
        return " ".join(parts + [self.optimizer])

    @property
    def exotic(self) -> int:
        flags = {"gradient_checkpointing": self.gradient_checkpointing, "adamw_8bit": self.optimizer.endswith("_8bit"),
                 "fsdp": self.strategy == "fsdp", "lora": self.lora, "cpu_offload": self.cpu_offload,
                 "qlora": bool(self.base_bits), "activation_offload": self.activation_offload}
        return sum(_EXOTIC[k] for k, on in flags.items() if on)


@dataclass
class ModelFacts:
    """What the formulas need of the model, with and without LoRA."""

    params: dict[bool, list[Param]]  # lora? -> every parameter tensor
    shape: dict[bool, Shape]
    unit: dict[bool, tuple[int, int]]  # lora? -> (params, trainable params) of the largest FSDP unit
    vocab: int
    loss_chunk: int | None = None  # train.chunked_loss (a family with chunked heads): tokens per chunk of logits


@dataclass
class Lengths:
    """Tokens per micro-batch (``tokens``) and where it came from; example lengths when data was read."""

    tokens: int
    source: str
    max_len: int | None = None
    p95_len: int | None = None
    budget: int | None = None


@dataclass
class PlanRow:
    strategy: Strategy
    seq_len: int
    per_gpu_bytes: dict[str, int]
    fits: bool
    max_tokens: int  # the largest micro-batch (tokens) that fits, 0 when nothing does
    host_bytes: dict[str, int] = field(default_factory=dict)  # per process and per machine (plan/host.py)
    host_fits: bool = True  # the machine's RAM holds every process of the run (True when not checked)

    @property
    def usable(self) -> bool:
        """Fits the GPU and the host: what the plan may recommend."""
        return self.fits and self.host_fits

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self.strategy), "seq_len": self.seq_len, "per_gpu_bytes": self.per_gpu_bytes,
                "fits": self.fits, "max_batch_tokens": self.max_tokens, "host_bytes": self.host_bytes,
                "host_fits": self.host_fits}


@dataclass
class Plan:
    rows: list[PlanRow]
    lengths: Lengths
    gpu_bytes: int
    total_params: int
    trainable: dict[bool, int] = field(default_factory=dict)
    host_memory: int | None = None  # bytes of RAM of one machine; None: not checked
    precision: str = ""  # what train.precision computes in on this card, when it says so
    host_source: str = ""  # where host_memory came from (--host-memory, a Colab runtime, this machine)

    def recommended(self, lora: bool | None = None) -> PlanRow | None:
        """The row fitting GPU and host with the fewest GPUs, then the least exotic strategy (``lora`` filters)."""
        fitting = [r for r in self.rows if r.usable and (lora is None or r.strategy.lora == lora)]
        return min(fitting, key=lambda r: (r.strategy.gpus, r.strategy.exotic), default=None)


def compute_mode(cfg: RunConfig, strategy: str, bf16: bool = True) -> str:
    """``fp32`` without mixed precision; pure ``bf16`` under FSDP2's mixed precision; else ``autocast``.
    ``train.precision=auto`` resolves as training does on a CUDA card with (``bf16``) or without native bf16."""
    from voxrelay.precision import Capability, resolve

    if resolve(cfg.train.precision, strategy, Capability("GPU", bf16))[0] == "no":
        return "fp32"
    return "bf16" if strategy == "fsdp" else "autocast"


def phases(facts: ModelFacts, st: Strategy, tokens: int, compute: str, fused: bool = True) -> tuple[dict, dict]:
    """The columns (each part at its own largest) and what one GPU holds at each phase of a step, on top of
    ``resident`` (weights and optimizer states it keeps, DDP's gradient buckets):

    - ``loss``: the log-softmax's backward, before any weight gradient exists (FSDP2 has resharded every
      unit after the forward: none is gathered); with the chunked loss (``facts.loss_chunk``) one chunk of
      logits beside the head's gradient, which it makes as it goes (``head`` then has no logits; not under
      FSDP, where the head's loss stays materialised: see :func:`voxrelay.models.linear_ce.choose_loss`);
    - ``head``: the output layer's backward: its weight gradient in the compute dtype and in fp32 (FSDP: the
      largest unit gathered, with its unsharded gradient), the logits' fp32 gradient;
    - ``layers``: under gradient checkpointing, a recomputed layer with every gradient (an upper bound);
    - ``end``: the backward's end: every gradient (autocast's copies are gone: the backward runs outside its
      region, see :func:`~voxrelay.plan.formulas.autocast_copies`), and the largest unit's gradient
      twice (an input embedding tied to the output layer gets a dense gradient of its own, added to the
      head's; under FSDP the unit is still gathered and its reduce-scatter output exists too);
    - ``step``: the optimizer step. The fused AdamW voxrelay uses on a GPU makes no copies, nor do
      bitsandbytes' 8-bit kernels there (not measured: in place); the unfused AdamW (``fused=False``: CPU,
      offloaded states), Lion and Adafactor make two temporaries of the largest tensor they update.
    """
    params, shape = facts.params[st.lora], facts.shape[st.lora]
    if st.base_bits:  # QLoRA: the quantised weights, and one of them dequantised at a time in backward
        dequantised = dequantised_bytes(params, 4 if compute == "fp32" else 2)
        params = quantised_params(params, st.base_bits)
    gc = st.gradient_checkpointing
    copies = autocast_copies(params, gc, shape.layers) if compute == "autocast" else 0
    unit, unit_trainable = facts.unit[st.lora]
    item = 4 if compute == "fp32" else 2
    shards = st.gpus if st.strategy == "fsdp" else 1
    largest = max((p.shard_numel(shards) * p.itemsize for p in params if p.trainable), default=0)
    fused = fused and st.optimizer not in UNFUSED_OPTIMIZERS
    if st.strategy == "fsdp":
        gathered, unit_grad = unit * item, 4 * unit_trainable  # fp32 reduce-scatter input of the unit
        local = 0 if st.cpu_offload else 1  # offloaded: parameters, gradients and states in CPU memory
        resident = local * (weight_bytes(params, st.gpus) + optimizer_bytes(params, st.optimizer, st.gpus))
        grads = local * grad_bytes(params, st.gpus)
        cols = {"weights": local * weight_bytes(params, st.gpus) + gathered, "grads": grads + unit_grad,
                "optimizer": local * optimizer_bytes(params, st.optimizer, st.gpus)}
        head = gathered + unit_grad + item * unit_trainable
        end = grads + gathered + 2 * unit_grad  # + the input embedding's dense gradient (tied to the head)
        temps = 0 if (fused and not st.cpu_offload) else local * 2 * largest
    else:
        grads = grad_bytes(params)
        buckets = grads if st.gpus > 1 else 0  # DDP's reducer keeps a second copy, always allocated
        resident = weight_bytes(params) + optimizer_bytes(params, st.optimizer) + buckets
        cols = {"weights": weight_bytes(params), "grads": grads + buckets,
                "optimizer": optimizer_bytes(params, st.optimizer)}
        head = unit_trainable * (4 if compute == "fp32" else 4 + item)
        end = grads + 4 * unit_trainable  # the input embedding's dense gradient, added to the tied head's
        temps = 0 if fused else 2 * largest
    offload = gc and st.activation_offload  # the layer inputs in host memory (offloaded_host_bytes)
    acts = activation_bytes(shape, tokens, compute, gc, copies, offload=offload)
    at_loss = activation_bytes(shape, tokens, compute, gc, copies, at_loss=True, offload=offload)
    if facts.loss_chunk and st.strategy != "fsdp":  # the head's gradient made with the loss, a chunk at a time
        logits = chunked_logits_bytes(facts.vocab, tokens, facts.loss_chunk, compute)
        loss, head_phase = at_loss + head + logits, at_loss + head  # (FSDP keeps the materialised loss)
        # measured: at the backward's end one more float32 copy of the head's gradient (the one the loss made
        # is summed out of place with a tied embedding's, or copied into a separate head's .grad)
        end += 4 * unit_trainable
        # the grads column at its largest: the head's gradient and its chunk's bf16 product can outweigh every
        # fp32 gradient of a model that is mostly its head
        cols["grads"] = max(cols["grads"], cols["grads"] - grads + head)
    else:
        logits = logits_bytes(facts.vocab, tokens)
        loss, head_phase = at_loss + logits, at_loss + head + LOGITS_GRAD_PER_VOCAB * facts.vocab * tokens
    cols.update(activations=acts, logits=logits)
    steps = {"loss": loss, "head": head_phase, "layers": acts + grads if gc else 0, "end": end,
             "step": grads + temps}
    if st.base_bits and gc:
        steps["layers"] += dequantised
    return {**cols, "resident": resident}, steps


def per_gpu(facts: ModelFacts, st: Strategy, tokens: int, compute: str, fused: bool = True) -> dict[str, Any]:
    """Bytes per GPU by column for strategy ``st`` and a micro-batch of ``tokens`` tokens; ``total`` is the
    step's peak (what stays plus its largest phase) plus the overhead, ``peak_phase`` names that phase."""
    cols, steps = phases(facts, st, tokens, compute, fused)
    phase = max(steps, key=steps.get)
    allocated = cols.pop("resident") + steps[phase]
    overhead = overhead_bytes(allocated)
    return {**cols, "overhead": overhead, "total": allocated + overhead, "peak_phase": phase}


def offloaded_host_bytes(facts: ModelFacts, st: Strategy, tokens: int, compute: str) -> int:
    """Host memory (pinned on CUDA) one process holds for ``train.activation_offload`` at its peak: every
    checkpointed layer's input of a micro-batch of ``tokens`` tokens; 0 for a strategy without it. What the
    GPU columns no longer hold, for the host's own pricing to add."""
    if not (st.gradient_checkpointing and st.activation_offload):
        return 0
    return offloaded_activation_bytes(facts.shape[st.lora], tokens, compute)


def max_tokens(facts: ModelFacts, st: Strategy, compute: str, gpu_bytes: int) -> int:
    """The largest micro-batch in tokens whose total fits ``gpu_bytes`` (0 when even the states do not). Each
    phase is linear in tokens: the bound is the smallest over phases of (room - its fixed part) / its slope."""
    room = (gpu_bytes - OVERHEAD_FIXED) / (1 + FRAGMENTATION)
    cols0, at0 = phases(facts, st, 0, compute)
    _, at1 = phases(facts, st, 1 << 20, compute)
    room -= cols0["resident"]
    if room <= 0 or any(at0[k] > room for k in at0):
        return 0
    slopes = {k: (at1[k] - at0[k]) / (1 << 20) for k in at0}
    best = int(min((room - at0[k]) / slopes[k] for k in at0 if slopes[k] > 0))
    while best > 0 and per_gpu(facts, st, best, compute)["total"] > gpu_bytes:  # int rounding of the overhead
        best -= 1
    return best


def strategies(gpus: int, optimizer: str) -> list[Strategy]:
    """The combinations the plan prices for each GPU count 1, 2, 4, ... up to ``gpus`` (and ``gpus``)."""
    counts = sorted({2**i for i in range(int(math.log2(gpus)) + 1)} | {gpus})
    optimizers = [optimizer] + ([f"{optimizer}_8bit"] if optimizer in ("adamw", "lion") else [])
    # bitsandbytes' 8-bit step fails on FSDP2's DTensors (train refuses the pair): FSDP rows use the 32-bit form
    fsdp_opt = optimizer.removesuffix("_8bit")
    out: list[Strategy] = []
    for n in counts:
        for opt in optimizers:
            out += [Strategy("ddp", n, False, opt), Strategy("ddp", n, False, opt, gradient_checkpointing=True)]
        if n > 1:
            out += [Strategy("fsdp", n, False, fsdp_opt), Strategy("fsdp", n, False, fsdp_opt,
                                                                   gradient_checkpointing=True)]
        # offloaded optimizer states live in CPU memory: the optimizer does not change the GPU's share
        out.append(Strategy("fsdp", n, False, fsdp_opt, cpu_offload=True, gradient_checkpointing=True))
        out += [Strategy("ddp", n, True, optimizer), Strategy("ddp", n, True, optimizer, gradient_checkpointing=True)]
        # the layer inputs in host memory: for long sequences on a small card (the optimizer does not change them)
        out += [Strategy("ddp", n, lora, optimizer, gradient_checkpointing=True, activation_offload=True)
                for lora in (False, True)]
        if n > 1:
            out.append(Strategy("fsdp", n, True, fsdp_opt, gradient_checkpointing=True))
        # QLoRA (4-bit base) under DDP only: FSDP2's DTensors drop bitsandbytes' quantisation state
        out.append(Strategy("ddp", n, True, optimizer, gradient_checkpointing=True, base_bits=4))
    return out


def configured(cfg: RunConfig, gpus: int) -> Strategy:
    """The strategy the config asks for on ``gpus`` GPUs; the strategy keys (train.strategy,
    train.gradient_checkpointing, train.cpu_offload, train.activation_offload) default to DDP without any where a
    config has none."""
    tc = cfg.train
    return Strategy(getattr(tc, "strategy", "ddp") or "ddp", gpus, tc.lora is not None, tc.optimizer,
                    bool(getattr(tc, "cpu_offload", False)), bool(getattr(tc, "gradient_checkpointing", False)),
                    (tc.lora.base_bits or 0) if tc.lora is not None else 0,
                    bool(getattr(tc, "activation_offload", False)))


def make_plan(cfg: RunConfig, facts: ModelFacts, lengths: Lengths, gpus: int, gpu_bytes: int,
              bf16: bool = True, host_memory: int | None = None) -> Plan:
    """Every strategy on 1, 2, 4, ... ``gpus`` GPUs of ``gpu_bytes`` each (``bf16``: with native bf16, for
    ``train.precision=auto``), and its host RAM against ``host_memory`` bytes per machine (None: not checked)."""
    from voxrelay.plan.host import host_bytes, host_max_tokens

    if gpus < 1:
        raise PlanError(f"--gpus {gpus} must be at least 1")
    rows = []
    priced = strategies(gpus, cfg.train.optimizer)
    if configured(cfg, gpus) not in priced:  # e.g. LoRA with 8-bit Adam: price the config's own choice too
        priced.append(configured(cfg, gpus))
    for st in priced:
        compute = compute_mode(cfg, st.strategy, bf16)
        b = per_gpu(facts, st, lengths.tokens, compute)
        host = host_bytes(cfg, facts, st, lengths.tokens, activations=offloaded_host_bytes(facts, st, lengths.tokens,
                                                                                          compute))
        most = max_tokens(facts, st, compute, gpu_bytes)
        if host_memory is not None:  # the host's share grows with the micro-batch too (data, offloaded inputs)
            most = min(most, host_max_tokens(cfg, facts, st, compute, host_memory))
        rows.append(PlanRow(st, lengths.tokens, b, b["total"] <= gpu_bytes, most,
                            host, host_memory is None or host["machine"] <= host_memory))
    total = sum(p.numel for p in facts.params[False])
    trainable = {lora: sum(p.numel for p in facts.params[lora] if p.trainable) for lora in (False, True)}
    precision = {"auto": "auto: bf16" if bf16 else "auto: fp16 with a loss scaler (this card has no bf16; fsdp rows "
                 "fp32)", "bf16": "" if bf16 else "bf16, emulated on this card (slow): train.precision=auto trains "
                 "in fp16 here"}.get(cfg.train.precision, "")
    return Plan(rows, lengths, gpu_bytes, total, trainable, host_memory, precision)

