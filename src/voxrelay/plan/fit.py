"""The run against its memory plan (:mod:`voxrelay.plan`): before any weight reaches a GPU, the config's
own strategy is priced for this GPU and the run stops (exit 2) with the plan's table and a suggestion when
it will not fit (``train.ignore_plan`` overrides); and when a step runs out of memory anyway, the advice
names the plan's next-best strategy as config overrides."""

from __future__ import annotations

import io
import logging

from rich.console import Console

from voxrelay.config import RunConfig
from voxrelay.plan import Plan, PlanError, PlanRow, Strategy, configured, make_plan

log = logging.getLogger(__name__)


class WillNotFitError(PlanError):
    """The plan predicts that the configured strategy does not fit the GPU."""


def plan_of(cfg: RunConfig, index: dict, world: int, gpu_bytes: int) -> Plan:
    """The plan of ``cfg`` for ``world`` GPUs of ``gpu_bytes`` each (meta-device build: no weights read)."""
    from voxrelay.plan.host import this_machine
    from voxrelay.plan.model import lengths, model_facts

    facts, model = model_facts(cfg, index)
    return make_plan(cfg, facts, lengths(cfg, model, index, None), world, gpu_bytes, host_memory=this_machine())


def check_fits(cfg: RunConfig, index: dict, world: int, gpu_bytes: int | None) -> None:
    """Stop before loading weights when the plan says the config's strategy will not fit ``gpu_bytes``
    (None: no GPU, nothing to check). ``train.ignore_plan`` turns the stop into a warning."""
    if gpu_bytes is None:
        return
    plan = plan_of(cfg, index, world, gpu_bytes)
    mine = configured(cfg, world)
    row = next(r for r in plan.rows if r.strategy == mine)
    gb = row.per_gpu_bytes["total"] / 1e9
    if not row.host_fits:  # the host's share rests on assumptions (CUDA's libraries): said, not enforced
        log.warning("the memory plan predicts %.1f GB of host RAM for this machine's processes, more than its %.1f "
                    "GB: the run may be killed by the kernel (see `voxrelay plan`)", row.host_bytes["machine"] / 1e9,
                    plan.host_memory / 1e9)
    if row.fits:
        log.info("memory plan: %s needs %.1f GB per GPU of %.1f GB", mine.name, gb, gpu_bytes / 1e9)
        return
    text = render(plan, mine)
    if cfg.train.ignore_plan:
        log.warning("the memory plan predicts %.1f GB per GPU for %s, more than this GPU's %.1f GB; going on "
                    "because train.ignore_plan is set\n%s", gb, mine.name, gpu_bytes / 1e9, text)
        return
    best = next_best(plan, mine)
    fix = f"try {overrides(best.strategy, cfg)}" if best else "nothing fits: lower train.batch_tokens or add GPUs"
    raise WillNotFitError(f"the memory plan predicts {gb:.1f} GB per GPU for {mine.name}, more than this GPU's "
                          f"{gpu_bytes / 1e9:.1f} GB; {fix} (or train.ignore_plan=true to try anyway)\n{text}")


def next_best(plan: Plan, mine: Strategy) -> PlanRow | None:
    """The least exotic strategy on the same number of GPUs that the plan predicts to fit, else to need
    less memory than ``mine`` (when the plan itself was too optimistic, e.g. at an OOM)."""
    same = [r for r in plan.rows if r.strategy.gpus == mine.gpus and r.strategy != mine]
    total = next((r.per_gpu_bytes["total"] for r in plan.rows if r.strategy == mine), None)
    fitting = [r for r in same if r.usable and (total is None or r.per_gpu_bytes["total"] < total)]
    smaller = [r for r in same if total is not None and r.per_gpu_bytes["total"] < total]
    return min(fitting or smaller, key=lambda r: (r.strategy.exotic, r.per_gpu_bytes["total"]), default=None)


def overrides(st: Strategy, cfg: RunConfig) -> str:
    """The command-line overrides that turn ``cfg``'s strategy into ``st``."""
    tc, out = cfg.train, []
    if st.strategy != tc.strategy:
        out.append(f"train.strategy={st.strategy}")
    if st.gradient_checkpointing != tc.gradient_checkpointing:
        out.append(f"train.gradient_checkpointing={str(st.gradient_checkpointing).lower()}")
    if st.activation_offload != tc.activation_offload:
        out.append(f"train.activation_offload={str(st.activation_offload).lower()}")
    if st.cpu_offload != tc.cpu_offload:
        out.append(f"train.cpu_offload={str(st.cpu_offload).lower()}")
    if st.optimizer != tc.optimizer:
        out.append(f"train.optimizer={st.optimizer}")
    bits = (tc.lora.base_bits or 0) if tc.lora is not None else 0
    if st.lora and st.base_bits != bits:  # the dotted key makes the section when LoRA is off
        out.append(f"train.lora.base_bits={st.base_bits or 'null'}")
    elif st.lora != (tc.lora is not None):
        out.append("train.lora=true" if st.lora else "train.lora=null")
    return " ".join(out) or "the same strategy with a smaller train.batch_tokens"


def oom_advice(cfg: RunConfig, index: dict, world: int, gpu_bytes: int | None) -> str:
    """What to change after an out-of-memory error: the plan's next-best strategy, as overrides."""
    try:
        plan = plan_of(cfg, index, world, gpu_bytes or 80 * 10**9)
    except Exception as e:  # noqa: BLE001 (advice must never hide the OOM itself)
        log.debug("no memory plan for the OOM advice: %s", e)
        return "lower train.batch_tokens, or turn on train.gradient_checkpointing (see `voxrelay plan`)"
    mine = configured(cfg, world)
    best = next_best(plan, mine)
    if best is None:
        return "lower train.batch_tokens (no strategy on this many GPUs needs less memory; see `voxrelay plan`)"
    return (f"the plan's next-best strategy here is {best.strategy.name} ({best.per_gpu_bytes['total'] / 1e9:.1f} GB "
            f"per GPU predicted): re-run with {overrides(best.strategy, cfg)}, or lower train.batch_tokens "
            "(`voxrelay plan` shows every option)")


def render(plan: Plan, mine: Strategy) -> str:
    from voxrelay.plan.render import print_plan

    buf = io.StringIO()
    print_plan(plan, Console(file=buf, width=132, soft_wrap=True, color_system=None), mine)
    return buf.getvalue()


def gpu_memory() -> int | None:
    """Memory of this process' GPU in bytes (None without CUDA)."""
    import torch

    if not torch.cuda.is_available():
        return None
    return int(torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory)
