"""``voxrelay plan CONFIG --cheapest``: the cheapest card and count (of :data:`voxrelay.plan.cards.CARDS`) whose
plan fits this run, GPU and host, and what the whole run (``train.max_steps`` steps) would cost on it.

Cost = GPUs x USD per GPU-hour (the table's on-demand or spot price, or ``cost.gpu_hour``) x steps x the
seconds of one step / 3600. The step time is the run's own when it has measured one (its metrics' newest
throughput, on whatever card it ran: other cards differ), else estimated: FLOPs of one step on one GPU over the
card's dense bf16/fp16 peak at :data:`MFU` of it. FLOPs per token (N: the weights of the Linears a token passes
through, embeddings excluded; L layers of width h; s tokens of context): 6N for a full fine-tune (forward 2N,
backward 4N), 4N + 6 x trainable under LoRA (no weight gradients of the frozen base), + 2N under gradient
checkpointing (the forward again), + 6 L h s of attention. Every GPU of a DDP or FSDP run steps its own
micro-batch of ``tokens`` x ``train.grad_accum``: the step time does not fall with more GPUs, the cost rises,
so a card fits with as few GPUs as it can. CPU offload's transfers are not priced.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from voxrelay.plan import Lengths, ModelFacts, Plan, PlanRow, make_plan
from voxrelay.plan.cards import CARDS, Card, gpu_hour

MFU = 0.30  # model FLOPs utilisation assumed for the estimate: typical of a fine-tune on one card, not measured


@dataclass
class Offer:
    """One card's cheapest fitting row and the run's cost on it (None: the card has no such price)."""

    card: Card
    row: PlanRow
    price: float | None  # USD per GPU-hour
    step_seconds: float  # estimated
    basis: str  # how the estimate was made
    steps: int
    measured: float | None = None  # seconds per step the run measured (on the card it ran on)
    where: str = ""  # the price's source: the card table's provider, or cost.gpu_hour

    @property
    def hours(self) -> float:
        return self.steps * self.step_seconds / 3600

    @property
    def cost(self) -> float | None:
        """USD of the run at the estimated step time (what cards are ranked by: the same basis for each)."""
        return None if self.price is None else self.row.strategy.gpus * self.price * self.hours

    @property
    def measured_cost(self) -> float | None:
        """USD of the run at the step time it measured, None without one."""
        if self.price is None or self.measured is None:
            return None
        return self.row.strategy.gpus * self.price * self.steps * self.measured / 3600


def flops_per_token(facts: ModelFacts, lora: bool, checkpointing: bool, context: int) -> float:
    """Training FLOPs per token (the module's docstring)."""
    params = facts.params[lora]
    n = sum(p.numel for p in params if p.linear)
    trainable = sum(p.numel for p in params if p.trainable and p.linear)
    shape = facts.shape[lora]
    per_token = (4 * n + 6 * trainable if lora else 6 * n) + (2 * n if checkpointing else 0)
    return per_token + 6 * shape.layers * shape.hidden * context


def step_seconds(facts: ModelFacts, row: PlanRow, card: Card, grad_accum: int, context: int) -> float:
    """Estimated seconds of one optimizer step of ``row``'s strategy on ``card``."""
    st = row.strategy
    flops = flops_per_token(facts, st.lora, st.gradient_checkpointing, context) * row.seq_len * grad_accum
    return flops / (card.tflops * 1e12 * MFU)


def offers(cfg: Any, facts: ModelFacts, lengths: Lengths, max_gpus: int, spot: bool = False,
           host_memory: int | None = None, measured: float | None = None) -> list[Offer]:
    """Every card's cheapest fitting row (fewest GPUs, then least memory), cheapest run first; cards where
    nothing fits are left out. ``measured``: seconds per step the run measured, priced beside the estimate (it
    was measured on one card, whichever the run had: the ranking compares the cards' estimates)."""
    context = min(lengths.tokens, lengths.max_len or lengths.tokens)
    out = []
    for card in CARDS.values():
        plan: Plan = make_plan(cfg, facts, lengths, max_gpus, card.memory, card.bf16, host_memory)
        fitting = [r for r in plan.rows if r.usable]
        if not fitting:
            continue
        price = gpu_hour(card, spot, cfg.cost.gpu_hour)
        timed = [(step_seconds(facts, r, card, cfg.train.grad_accum, context), r) for r in fitting]
        seconds, row = min(timed, key=lambda t: (t[1].strategy.gpus * t[0], t[1].strategy.exotic))
        basis = f"estimated from FLOPs at {MFU:.0%} of {card.tflops:g} TFLOPS"
        where = card.where if cfg.cost.gpu_hour is None else "cost.gpu_hour"
        out.append(Offer(card, row, price, seconds, basis, cfg.train.max_steps, measured, where))
    # equal costs (one cost.gpu_hour for every card, or 0): the faster run first
    return sorted(out, key=lambda o: (o.cost is None, o.cost or 0.0, o.hours, o.card.memory))


def host_shortfall(cfg: Any, facts: ModelFacts, lengths: Lengths, max_gpus: int) -> int | None:
    """The fewest bytes of host RAM per machine any card's GPU-fitting row needs (None: none fits a GPU)."""
    need = [r.host_bytes["machine"] for card in CARDS.values()
            for r in make_plan(cfg, facts, lengths, max_gpus, card.memory, card.bf16, None).rows if r.fits]
    return min(need, default=None)


def measured_step_seconds(run_uri: str) -> float | None:
    """Seconds per step of the run's newest throughput reports (what ``status`` shows), None when it has none."""
    from voxrelay.monitor.status import StatusError, run_status

    try:
        sps = run_status(run_uri).steps_per_sec
    except (StatusError, OSError, ValueError):
        return None
    return 1 / sps if sps else None


def to_json(found: list[Offer]) -> str:
    """One object per card that fits, cheapest first (``--cheapest --json``)."""
    import json

    return json.dumps([{"card": o.card.key, "gpus": o.row.strategy.gpus, "strategy": o.row.strategy.name,
                        "per_gpu_bytes": o.row.per_gpu_bytes["total"], "host_bytes": o.row.host_bytes["machine"],
                        "usd_per_gpu_hour": o.price, "step_seconds": o.step_seconds, "step_basis": o.basis,
                        "steps": o.steps, "hours": o.hours, "usd": o.cost, "measured_step_seconds": o.measured,
                        "measured_usd": o.measured_cost} for o in found], indent=1)


def print_offers(found: list[Offer], console: Any, spot: bool, host_memory: int | None,
                 short_of_host: int | None = None) -> None:
    """A line per card that fits, cheapest first, then the answer. ``short_of_host``: when no card fits the
    host, the fewest bytes of host RAM per machine a GPU-fitting row needs."""
    from rich.table import Table

    from voxrelay.plan.render import short_name

    kind = "spot" if spot else "on-demand"
    if found and found[0].where == "cost.gpu_hour":
        kind = "cost.gpu_hour"
    table = Table(title=f"cheapest fit per card, {kind} prices (USD per GPU-hour; cost.gpu_hour overrides)")
    for name in ("card", "GPUs", "strategy", "GB per GPU", "host GB", "$/GPU-h", "s/step", "hours", "run $"):
        table.add_column(name, justify="left" if name in ("card", "strategy") else "right", no_wrap=True)
    for o in found:
        price = "-" if o.price is None else f"{o.price:.3g}"
        table.add_row(o.card.label, str(o.row.strategy.gpus), short_name(o.row),
                      f"{o.row.per_gpu_bytes['total'] / 1e9:.1f}", f"{o.row.host_bytes['machine'] / 1e9:.1f}",
                      price, f"{o.step_seconds:.3g}", f"{o.hours:.3g}", "-" if o.cost is None else f"{o.cost:.2f}")
    console.print(table)
    if host_memory is None:
        console.print("host RAM not checked: pass --host-memory GB (the RAM of the machine the card comes with)")
    best = next((o for o in found if o.cost is not None), None)
    if best is None:
        if found:
            console.print("no card here has a price")
        elif short_of_host:
            console.print(f"[red]no card of the table fits this run[/]: it needs at least {short_of_host / 1e9:.1f} GB "
                          f"of host RAM per machine (--host-memory {host_memory / 1e9:.1f} GB); more GPUs on one "
                          "machine need more of it, a smaller micro-batch (train.batch_tokens / --seq-len) a little "
                          "less")
        else:
            console.print("[red]no card of the table fits this run[/]: lower the micro-batch (train.batch_tokens / "
                          "--seq-len) or allow more GPUs (--gpus)")
        return
    st = best.row.strategy
    console.print(f"cheapest: [bold]{st.gpus} x {best.card.label}[/] ({kind} ${best.price:.3g}/GPU-h, "
                  f"{best.where}), {st.name}: {best.steps:,} steps x {best.step_seconds:.3g} s ({best.basis}) = "
                  f"{best.hours:.3g} h -> [bold]${best.cost:.2f}[/]", highlight=False)
    if best.measured_cost is not None:
        console.print(f"at this run's measured {best.measured:.3g} s per step (its newest throughput, on the card it "
                      f"ran on): {best.steps * best.measured / 3600:.3g} h -> [bold]${best.measured_cost:.2f}[/]",
                      highlight=False)
