"""``voxrelay plan``'s output: a table per GPU count, the largest batch that fits, a recommendation; or JSON."""

from __future__ import annotations

import json

from rich.console import Console
from rich.table import Table

from voxrelay.plan import Plan, PlanRow, Strategy
from voxrelay.plan.formulas import GB

COLUMNS = ("weights", "grads", "optimizer", "activations", "logits", "overhead", "total")
HEADERS = ("weights", "grads", "optim", "activ", "logits", "overhead", "total")


def to_json(plan: Plan) -> str:
    return json.dumps([r.to_json() for r in plan.rows], indent=1)


def _gb(n: int) -> str:
    return f"{n / GB:.1f}"


def _row_cells(r: PlanRow) -> list[str]:
    b = r.per_gpu_bytes
    fits = ("[green]yes[/]" if r.host_fits else "[red]host[/]") if r.fits else "[red]no[/]"
    host = _gb(r.host_bytes["machine"]) if r.host_bytes else "-"
    host = host if r.host_fits else f"[red]{host}[/]"
    return [short_name(r), *(_gb(b[c]) for c in COLUMNS), fits, f"{r.max_tokens:,}" if r.max_tokens else "-", host]


def short_name(r: PlanRow) -> str:
    """The strategy without its GPU count (the table's title has it): e.g. ``fsdp full gc 8bit``."""
    st = r.strategy
    words = [st.strategy, f"qlora{st.base_bits}" if st.base_bits else "lora" if st.lora else "full"]
    words += ["gc"] * st.gradient_checkpointing + ["act-offload"] * st.activation_offload
    words += ["offload"] * st.cpu_offload + [{"adamw_8bit": "8bit", "lion": "lion", "lion_8bit": "lion 8bit",
                                                    "adafactor": "adafactor"}.get(st.optimizer, "")]
    return " ".join(w for w in words if w)


def _count(n: int) -> str:
    """A parameter count: 3.30B, 48.6M, 5.8M."""
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"


def _host_line(plan: Plan) -> str:
    source = f" ({plan.host_source})" if plan.host_source else ""
    host = (f"host RAM: {plan.host_memory / GB:.1f} GB per machine{source}" if plan.host_memory
            else "host RAM: not checked (--host-memory GB)")
    return host + (f"; precision {plan.precision}" if plan.precision else "")


def print_plan(plan: Plan, console: Console, mine: Strategy) -> None:
    """The tables, then the config's own strategy (``mine``) and the recommendation."""
    ln = plan.lengths
    console.print(f"{_count(plan.total_params)} parameters; trained: full {_count(plan.trainable[False])}, "
                  f"LoRA {_count(plan.trainable[True])}. GPU: {plan.gpu_bytes / GB:.1f} GB. "
                  f"Micro-batch: {ln.tokens:,} tokens ({ln.source})", highlight=False)
    console.print(_host_line(plan), highlight=False)
    if ln.max_len is not None:
        console.print(f"examples: longest {ln.max_len:,} tokens, 95th percentile {ln.p95_len:,}; batch budget "
                      f"{ln.budget:,} tokens", highlight=False)
    for gpus in sorted({r.strategy.gpus for r in plan.rows}):
        table = Table(title=f"GB per GPU, {gpus} GPU{'s' * (gpus > 1)}, {ln.tokens:,} tokens per GPU micro-batch",
                      caption="gc: gradient checkpointing; act-offload: layer inputs in host memory; 8bit: AdamW8bit; "
                              "fits: host = the GPU holds it, the machine's RAM does not; "
                              "max tokens: largest micro-batch that fits (GPU and host); "
                              "total: weights + optimizer + the step's largest phase (the loss' peak comes before "
                              "the gradients) + overhead, not the sum of the columns; host: GB of RAM of the "
                              "machine's processes (red: more than it has)")
        table.add_column("strategy", no_wrap=True)
        for name in (*HEADERS, "fits", "max tokens", "host"):
            table.add_column(name, justify="right", no_wrap=True)
        for r in plan.rows:
            if r.strategy.gpus == gpus:
                table.add_row(*_row_cells(r))
        console.print(table)
    _print_advice(plan, console, mine)


def _print_advice(plan: Plan, console: Console, mine: Strategy) -> None:
    row = next(r for r in plan.rows if r.strategy == mine)
    verdict = ("fits" if row.host_fits else "[red]fits the GPU, not the machine's RAM[/]") if row.fits \
        else "[red]does not fit[/]"
    room = f"up to {row.max_tokens:,} tokens per micro-batch" if row.max_tokens else "no micro-batch fits"
    console.print(f"this config ({mine.name}): {_gb(row.per_gpu_bytes['total'])} GB per GPU, {verdict}; {room}")
    if not row.host_fits:
        console.print(f"[red]its processes need {_gb(row.host_bytes['machine'])} GB of host RAM[/], more than the "
                      f"machine's {_gb(plan.host_memory)} GB")
    best, full = plan.recommended(), plan.recommended(lora=False)
    if best is None:
        short = any(r.fits and not r.host_fits for r in plan.rows)
        console.print("[red]nothing fits[/]: lower the micro-batch (train.batch_tokens / --seq-len), "
                      "use more GPUs (--gpus) or a bigger GPU" + (" (what fits the GPU needs more host RAM than "
                                                                  "the machine has)" if short else ""))
        return
    console.print(f"recommended: [bold]{best.strategy.name}[/] ({_gb(best.per_gpu_bytes['total'])} GB per GPU, "
                  f"up to {best.max_tokens:,} tokens per micro-batch)")
    if full is not None and full is not best:
        console.print(f"full fine-tune: {full.strategy.name} ({_gb(full.per_gpu_bytes['total'])} GB per GPU, "
                      f"up to {full.max_tokens:,} tokens)")
    elif full is None:
        console.print("a full fine-tune fits in none of these: use LoRA or more GPUs")
