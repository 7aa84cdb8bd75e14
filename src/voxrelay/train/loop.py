"""The training loop. It receives a built :class:`~voxrelay.train.build.Run` and fits on a screen."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
from dataclasses import dataclass, field

import torch

from voxrelay.checkpoint import preemption as pre
from voxrelay.checkpoint.stops import EXIT_OUT_OF_MEMORY, exit_code
from voxrelay.config import parse_duration
from voxrelay.cost.usage import BUDGET
from voxrelay.models.base import LossTerms, pop_counts, weighted_mean
from voxrelay.monitor.gpu import gpu_stats
from voxrelay.monitor.progress import ProgressLine, Throughput
from voxrelay.plan.fit import gpu_memory, oom_advice
from voxrelay.train.evaluate import evaluate
from voxrelay.train.resume import any_rank, save_checkpoint
from voxrelay.train.run import Run
from voxrelay.train.stops import (
    LEASE_LOST,
    NON_FINITE,
    OUT_OF_MEMORY,
    TIME_LIMIT,
    Decision,
    Stops,
    is_preemption,
)

log = logging.getLogger(__name__)


@dataclass
class StepStats:
    loss: float  # the objective: the weighted sum of the terms' means (this process's micro-batches)
    tokens: int  # targets of the weighted terms (throughput)
    audio_seconds: float
    grad_norm: float
    finite: bool = True  # False: NaN/inf loss or gradient norm, the optimizer step was skipped
    scaler_skipped: bool = False  # fp16: the GradScaler skipped the step (inf gradients) and lowered its scale
    terms: dict[str, float] = field(default_factory=dict)  # each term's mean, logged as loss/<term>


@dataclass
class TrainResult:
    step: int
    stop_reason: str | None  # None: reached train.max_steps
    durable: bool  # the last checkpoint is committed in the run folder
    exit_code: int


def train_step(run: Run, micro_batches: list[dict]) -> StepStats:
    """One optimizer step over ``grad_accum`` micro-batches. Each loss term is normalised by its target
    count over the whole step and every process (not averaged per micro-batch), then weighted."""
    acc = run.accelerator
    seconds = sum(b.pop("audio_seconds") for b in micro_batches)
    local = _step_counts([pop_counts(b) for b in micro_batches])  # counted by the family's collate
    scales = {name: acc.num_processes / max(total, 1)  # DDP averages gradients over processes
              for name, total in zip(local, _all_processes(acc, list(local.values())), strict=True)}
    sums = dict.fromkeys(local, 0.0)
    weights: dict[str, float] = {}
    for i, batch in enumerate(micro_batches):
        terms = micro_step(run, {k: v.to(acc.device) for k, v in batch.items()}, scales, i == len(micro_batches) - 1)
        for name, term in terms.items():
            sums[name] += float(term.sum.detach())
            weights[name] = term.weight
    # the norm is computed even without clipping (max_norm=inf): a NaN/inf one must not reach the weights
    clip = run.cfg.train.clip_norm if run.cfg.train.clip_norm is not None else float("inf")
    grad_norm = float(acc.clip_grad_norm_(run.module.parameters(), clip))
    # with fp16 an inf gradient is the GradScaler's business (it skips the step and lowers the scale)
    grads_ok = math.isfinite(grad_norm) or acc.scaler is not None
    loss = weighted_mean(sums, local, weights)
    finite = not any_rank(not (all(map(math.isfinite, sums.values())) and grads_ok), acc.device)
    skipped = False
    if finite:
        run.optimizer.step()
        skipped = acc.optimizer_step_was_skipped  # the scaler's skip: no update, so no EMA and schedule step
        if not skipped:
            run.model.after_optimizer_step()  # e.g. a family's EMA
            run.scheduler.step()
    run.optimizer.zero_grad(set_to_none=True)
    tokens = sum(local[name] for name, w in weights.items() if w)
    return StepStats(loss, tokens, seconds, grad_norm, finite, skipped,
                     {n: sums[n] / max(local[n], 1) for n in sums})


def micro_step(run: Run, batch: dict, scales: dict[str, float], last: bool) -> LossTerms:
    """Forward and backward of one micro-batch (gradients synchronised across processes on the ``last``).

    The backward runs outside the autocast region: autocast caches a bf16 copy of every trainable fp32 weight
    for the whole region, so a backward inside it would hold them all to its end (6.6 GB at 3B). Out of it,
    each copy lives as long as the matmul that saved it (a checkpointed layer re-enters autocast to recompute).
    The gradients are the same bits: the backward kernels run on the tensors the forward saved."""
    acc = run.accelerator
    with contextlib.nullcontext() if last else acc.no_sync(run.module):
        with acc.autocast():
            terms = run.model.loss(run.module, batch)
        acc.backward(_objective(terms, scales))
    return terms


def _step_counts(per_batch: list[dict[str, int]]) -> dict[str, int]:
    """Each term's target count over the micro-batches of a step (this process)."""
    counts: dict[str, int] = {}
    for batch in per_batch:
        for name, count in batch.items():
            counts[name] = counts.get(name, 0) + count
    return counts


def _all_processes(acc, counts: list[int]) -> list[int]:
    """``counts`` summed over every process (one all-reduce of a tensor on the accelerator's device)."""
    if acc.num_processes == 1:
        return counts
    return [int(c) for c in acc.reduce(torch.tensor(counts, device=acc.device), "sum").tolist()]


def _objective(terms: LossTerms, scales: dict[str, float]) -> torch.Tensor:
    """What is backpropagated for one micro-batch: each weighted term's sum times weight x processes / its
    count over the step (monitored-only terms, weight 0, left out)."""
    parts = []
    for name, term in terms.items():
        if term.weight:
            if name not in scales:
                raise KeyError(f"loss term {name!r} has no count in the batch: the family's collate must count it")
            parts.append(term.sum * (term.weight * scales[name]))
    total = parts[0]
    for part in parts[1:]:
        total = total + part
    return total


def _due(step: int, every: int | None) -> bool:
    return every is not None and step % every == 0


def train(run: Run) -> TrainResult:
    """Train until ``train.max_steps``, a stop signal, a time limit, early stopping or too many
    non-finite steps in a row. Whatever ends it, an exception included, the checkpoint manager is
    closed (the last good checkpoint still uploads, bounded) and the run's lease released."""
    try:
        return _train(run)
    finally:
        run.close(run.cfg.checkpoint.final_upload_timeout)  # the checkpoints' part a no-op once _finish closed it


def _train(run: Run) -> TrainResult:
    tc, ck, loop = run.cfg.train, run.cfg.checkpoint, run.loop
    deadline = pre.Deadline(parse_duration(tc.time_limit), parse_duration(tc.total_time_limit),
                            pre.session_start(tc.time_limit_from))
    if run.accelerator.is_main_process and (said := deadline.describe(tc.time_limit_from)) is not None:
        log.info(said)  # from when the session's limit counts: a machine up for hours has spent a boot-counted one
    trigger = pre.SaveTrigger(ck.every_steps, ck.every_minutes, parse_duration(ck.adaptive_mtbf), ck.every_epochs,
                              run.stream.cursor.epoch)
    meter, batches, t0, wall0 = Throughput(), iter(run.stream), time.time(), loop.wall_time
    if run.resumed_from is None and tc.eval_every:
        run.monitor.log(0, _guarded_eval(run, 0))  # the untrained baseline
    with pre.PreemptionWatcher(ck.preemption_poll, metadata_url=ck.metadata_url) as watcher, \
            ProgressLine(tc.max_steps, loop.step, enabled=run.accelerator.is_main_process) as bar:
        stops = Stops(run, watcher, deadline, trigger)
        decision = stops.agree(0.0, saving=False)  # e.g. the total budget was spent before
        while loop.step < tc.max_steps and decision.stop is None:
            started, cursor = time.time(), run.stream.state_dict()
            micro = [next(batches) for _ in range(tc.grad_accum)]
            waited = time.time() - started  # building (and, streaming, fetching) the batches: data_wait
            try:
                stats = train_step(run, micro)
            except torch.OutOfMemoryError as e:
                return _out_of_memory(run, e, cursor, stops, bar)
            loop.advance(stats.tokens, stats.audio_seconds, wall0 + time.time() - t0, stats.finite,
                         stats.scaler_skipped)
            meter.add(stats.tokens, stats.audio_seconds, waited)
            if run.usage is not None:  # renewed with the lease's cadence: a crash loop counts against cost.budget
                run.usage.heartbeat(loop.step, ck.lease_seconds / 3)
            _progress(run)
            _log_step(run, stats, meter, bar)
            results = _evaluate(run, stops, bar, time.time() - started)
            _progress(run)
            new_best = "eval/loss" in results and ck.keep_best and loop.evals_since_best == 0  # keep_best: saved
            decision = stops.agree(time.time() - started, best=new_best)
            last = decision.stop is not None or loop.step == tc.max_steps
            if (decision.save or last) and decision.stop != LEASE_LOST:  # taken over: write nothing
                trigger.saved(save_checkpoint(run, results, background=not last, stopped=decision.stop))
                _progress(run)
                run.monitor.sync()
                _record_usage(run, decision.stop)
        return _finish(run, decision, stops, bar)  # still watching: a second Ctrl-C while waiting aborts


def _progress(run: Run) -> None:
    """A step, eval or save done: the lease may be renewed (a hung trainer's is left to expire)."""
    if run.lease is not None:
        run.lease.progress()


def _evaluate(run: Run, stops: Stops, bar: ProgressLine, step_s: float) -> dict:
    """The eval due at this step, unless the run stops here (a signal, a notice, a limit): then saving
    comes first, and sampling plus Whisper could outlast a 30 s preemption notice."""
    loop, tc = run.loop, run.cfg.train
    if not (_due(loop.step, tc.eval_every) or loop.step == tc.max_steps):
        return {}
    stopping = stops.agree(step_s, saving=False).stop
    if stopping is not None:
        bar.note(f"stopping at step {loop.step} ({stopping}): its eval is skipped, the checkpoint saved first")
        return {}
    results = _guarded_eval(run, loop.step)
    if not results:
        return {}
    run.monitor.log(loop.step, results)
    bar.note(f"eval @{loop.step}: " + ", ".join(f"{k} {v:.3f}" for k, v in results.items() if not isinstance(v, str)))
    if "eval/loss" in results:  # its part failed (a warning said so): not an eval "without improvement"
        loop.record_eval(results["eval/loss"])
    return results


def _guarded_eval(run: Run, step: int) -> dict:
    """The eval of ``step``, or {} when it fails outside its guarded parts (reported): an eval must never cost the
    run its checkpoint (upstream users lose runs to evaluation crashing at the end of training)."""
    try:
        return evaluate(run, step)
    except Exception as err:  # noqa: BLE001
        log.error("the eval of step %d failed (%s: %s); training goes on and the checkpoint is saved", step,
                  type(err).__name__, str(err).split("\n")[0][:300])
        return {}


def _out_of_memory(run: Run, err: torch.OutOfMemoryError, cursor: dict, stops: Stops,
                   bar: ProgressLine) -> TrainResult:
    """A step ran out of memory: free it, save the state of the last complete step (its data cursor: the
    failed step's batches are trained again on resume; a no-op when that step's checkpoint is already on its
    way) and stop with the plan's next-best strategy. With several processes the others wait in a collective
    the failed one will never join: it exits at once (the last committed checkpoint stays durable; torchrun
    stops the rest)."""
    run.optimizer.zero_grad(set_to_none=True)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    run.stream.load_state_dict(cursor)
    acc = run.accelerator
    advice = oom_advice(run.cfg, run.index or {}, acc.num_processes, gpu_memory())
    log.error("step %d ran out of memory (%s); %s", run.loop.step + 1, str(err).split("\n")[0][:200], advice)
    if acc.num_processes > 1:
        logging.shutdown()
        os._exit(EXIT_OUT_OF_MEMORY)
    save_checkpoint(run, {}, background=False, stopped=OUT_OF_MEMORY)
    return _finish(run, Decision(OUT_OF_MEMORY), stops, bar)


def _log_step(run: Run, stats: StepStats, meter: Throughput, bar: ProgressLine) -> None:
    loop, tc = run.loop, run.cfg.train
    durable = run.checkpoints.durable_step
    metrics = {"loss": stats.loss, "durable_step": -1 if durable is None else durable}
    metrics |= {f"loss/{name}": value for name, value in stats.terms.items()}
    if not stats.finite:
        log.warning("step %d: non-finite loss (%s) or gradient norm (%s); the optimizer step was skipped "
                    "(%d in a row, the run stops at train.max_bad_steps=%d)", loop.step, stats.loss,
                    stats.grad_norm, loop.bad_in_a_row, tc.max_bad_steps)
    if _due(loop.step, tc.log_every) or loop.step == tc.max_steps or not stats.finite:
        metrics |= meter.report() | {"lr": run.scheduler.get_last_lr()[0], "grad_norm": stats.grad_norm,
                                     "epoch": run.stream.cursor.epoch, "bad_steps": loop.bad_steps}
        metrics |= {"scaler_skips": loop.scaler_skips} if run.accelerator.scaler is not None else {}
        metrics |= run.checkpoints.io_stats()  # upload MB/s, staging backlog, free disk where checkpoints stage
        metrics |= run.stream.io_stats() | gpu_stats()  # shard MB/s, free cache disk; GPU memory and utilisation
        run.monitor.log(loop.step, metrics)
    bar.update(loop.step, metrics, force_print=_due(loop.step, tc.log_every))


def _finish(run: Run, decision: Decision, stops: Stops, bar: ProgressLine) -> TrainResult:
    """Wait for the last upload (bounded: what is left of checkpoint.grace_seconds since the notice after a
    signal or notice, none once taken over, else checkpoint.final_upload_timeout), close the sinks, and pick
    the exit code (rank 0 decides, every rank returns it)."""
    ck, step, stop = run.cfg.checkpoint, run.loop.step, decision.stop
    durable = True
    if run.accelerator.is_main_process:
        if stop != LEASE_LOST and run.checkpoints.health().uploading:
            bar.note(f"waiting for the upload of step {step} to {run.cfg.run_uri}")
        timeout = 0.0 if stop == LEASE_LOST else stops.grace_left(decision) if decision.preempted else \
            ck.final_upload_timeout
        durable = run.checkpoints.close(timeout) and run.checkpoints.health().failed_saves == 0
        run.monitor.close()
        _report_end(run, stop, durable, bar)
    _record_usage(run, stop, final=True)  # the last upload's requests included
    refused = run.ranks.main and run.checkpoints.health().fatal is not None  # e.g. HTTP 403 on an upload
    code = run.ranks.broadcast(exit_code(stop, durable, refused) if run.ranks.main else None)
    return TrainResult(step, stop, durable, code)


def _record_usage(run: Run, stop: str | None, final: bool = False) -> None:
    """This session's GPU time and storage requests into the run's usage.json (every rank: a collective);
    nothing is written once the run was taken over."""
    if run.usage is not None:
        run.usage.record(run.ranks, run.loop.step, stop, write=stop != LEASE_LOST, wait=final)


def _report_end(run: Run, stop: str | None, durable: bool, bar: ProgressLine) -> None:
    step, health = run.loop.step, run.checkpoints.health()
    if stop == LEASE_LOST:
        bar.note(f"stopped at step {step} without saving: {run.lease.lost}. That session owns the run now")
    elif not durable and health.failed_saves:
        bar.note(f"stopped at step {step}: {health.failed_saves} save(s) in a row failed ({health.save_error}; "
                 f"the limit is checkpoint.max_failed_saves={run.cfg.checkpoint.max_failed_saves}); the last durable "
                 f"checkpoint: {_step_or_none(run.checkpoints.durable_step)}. Free the staging disk (VOXRELAY_CACHE) "
                 "or fix the error, then run the same command again")
    elif not durable:
        where = run.checkpoints.where_staged()
        error = health.fatal or health.upload_error or "the upload did not finish"
        fix = "Fix that (the credentials, the bucket), then run" if health.fatal else "Run"
        bar.note(f"the checkpoint of step {step} is only on this machine, at {where} ({error}). {fix} the same "
                 "command again on this machine to upload it and continue")
    elif stop is not None:
        saved = "checkpoint committed" if run.checkpoints.durable_step is not None else "no checkpoint yet"
        again = "; run the same command again to resume" if is_preemption(stop) or stop == TIME_LIMIT else ""
        bar.note(f"stopped at step {step} ({stop}); {saved}{again}")
    if stop == BUDGET and run.usage is not None:
        bar.note(run.usage.stop_message())
    if stop == NON_FINITE:
        bar.note(f"{run.loop.bad_in_a_row} steps in a row had a non-finite loss or gradient norm (each was "
                 f"skipped; {run.loop.bad_steps} in all), so the checkpoint of step {step} holds the last good "
                 "weights. Lower train.lr, keep train.clip_norm on, try train.precision=bf16 instead of fp16, "
                 "or look for broken rows in the data")


def _step_or_none(step: int | None) -> str:
    return "none yet" if step is None else f"step {step}"
