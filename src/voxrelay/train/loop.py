"""The training loop. It receives a built :class:`~voxrelay.train.build.Run` and fits on a screen."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

import torch

from voxrelay.checkpoint import preemption as pre
from voxrelay.config import parse_duration
from voxrelay.monitor.progress import ProgressLine, Throughput
from voxrelay.train.build import Run
from voxrelay.train.evaluate import evaluate
from voxrelay.train.resume import any_rank, save_checkpoint

TIME_LIMIT, EARLY_STOP = "train.time_limit", "early stopping"


@dataclass
class StepStats:
    loss: float
    tokens: int
    audio_seconds: float
    grad_norm: float


@dataclass
class TrainResult:
    step: int
    stop_reason: str | None  # None: reached train.max_steps
    durable: bool  # the last checkpoint is committed in the run folder
    exit_code: int


def train_step(run: Run, micro_batches: list[dict]) -> StepStats:
    """One optimizer step over ``grad_accum`` micro-batches; the loss is normalised by the number
    of loss tokens of the whole step, over every process (not averaged per micro-batch)."""
    acc, device = run.accelerator, run.accelerator.device
    seconds = sum(b.pop("audio_seconds") for b in micro_batches)
    local_tokens = sum(int((b["labels"][:, 1:] != -100).sum()) for b in micro_batches)
    total = local_tokens
    if acc.num_processes > 1:
        total = int(acc.reduce(torch.tensor(local_tokens, device=device), "sum"))
    scale = acc.num_processes / max(total, 1)  # DDP averages gradients over processes
    loss_sum = 0.0
    for i, batch in enumerate(micro_batches):
        batch = {k: v.to(device) for k, v in batch.items()}
        sync = contextlib.nullcontext() if i == len(micro_batches) - 1 else acc.no_sync(run.module)
        with sync, acc.autocast():
            loss, _ = run.model.loss(run.module, batch)
            acc.backward(loss * scale)
        loss_sum += float(loss.detach())
    grad_norm = float("nan")
    if run.cfg.train.clip_norm is not None:
        grad_norm = float(acc.clip_grad_norm_(run.module.parameters(), run.cfg.train.clip_norm))
    run.optimizer.step()
    run.scheduler.step()
    run.optimizer.zero_grad(set_to_none=True)
    return StepStats(loss_sum / max(local_tokens, 1), local_tokens, seconds, grad_norm)


def _due(step: int, every: int | None) -> bool:
    return every is not None and step % every == 0


def train(run: Run) -> TrainResult:
    """Train until ``train.max_steps``, a stop signal, ``train.time_limit`` or early stopping."""
    tc, ck, loop = run.cfg.train, run.cfg.checkpoint, run.loop
    limit = parse_duration(tc.time_limit)
    trigger = pre.SaveTrigger(ck.every_steps, ck.every_minutes, parse_duration(ck.adaptive_mtbf))
    meter, batches, t0, wall0 = Throughput(), iter(run.stream), time.time(), loop.wall_time
    if run.resumed_from is None and tc.eval_every:
        run.monitor.log(0, evaluate(run, 0))  # the untrained baseline
    stop = None
    main = run.accelerator.is_main_process
    with pre.PreemptionWatcher(ck.preemption_poll, metadata_url=ck.metadata_url) as watcher, \
            ProgressLine(tc.max_steps, loop.step, enabled=main) as bar:
        while loop.step < tc.max_steps and stop is None:
            stats = train_step(run, [next(batches) for _ in range(tc.grad_accum)])
            loop.advance(stats.tokens, stats.audio_seconds, wall0 + time.time() - t0)
            meter.add(stats.tokens, stats.audio_seconds)
            metrics = {"loss": stats.loss, "durable_step": run.checkpoints.durable_step or 0}
            if _due(loop.step, tc.log_every) or loop.step == tc.max_steps:
                metrics |= meter.report() | {"lr": run.scheduler.get_last_lr()[0], "grad_norm": stats.grad_norm,
                                             "epoch": run.stream.cursor.epoch}
                run.monitor.log(loop.step, metrics)
            bar.update(loop.step, metrics, force_print=_due(loop.step, tc.log_every))
            results = {}
            if _due(loop.step, tc.eval_every) or loop.step == tc.max_steps:
                results = evaluate(run, loop.step)
                run.monitor.log(loop.step, results)
                bar.note(f"eval @{loop.step}: " + ", ".join(f"{k} {v:.3f}" for k, v in results.items()))
                loop.record_eval(results["eval/loss"])
            stop = _stop_reason(run, watcher, limit)
            last = stop is not None or loop.step == tc.max_steps
            if trigger.due(loop.step) or last:
                trigger.saved(save_checkpoint(run, results, background=not last))
                run.monitor.sync()
        return _finish(run, stop, bar)  # still watching: a second Ctrl-C while waiting aborts


def _stop_reason(run: Run, watcher: pre.PreemptionWatcher, limit: float | None) -> str | None:
    loop, patience = run.loop, run.cfg.train.early_stopping_patience
    local = watcher.stop_reason
    if local is None and limit is not None and loop.wall_time >= limit:
        local = TIME_LIMIT
    if local is None and patience is not None and loop.evals_since_best >= patience:
        local = EARLY_STOP
    if any_rank(local is not None, run.accelerator.device):  # every rank stops at the same step
        return local or "another process stopped"
    return None


def _finish(run: Run, stop: str | None, bar: ProgressLine) -> TrainResult:
    """Wait for the last upload (bounded by checkpoint.grace_seconds after a signal), close sinks."""
    preempted = stop not in (None, TIME_LIMIT, EARLY_STOP)
    durable = True
    if run.accelerator.is_main_process:
        timeout = run.cfg.checkpoint.grace_seconds if preempted else None
        if run.checkpoints.uploader.pending:
            bar.note(f"waiting for the upload of step {run.loop.step} to {run.cfg.run_uri}")
        durable = run.checkpoints.close(timeout)
        run.monitor.close()
    if stop is not None:
        where = "committed" if durable else "staged on local disk only (the upload did not finish)"
        bar.note(f"stopped at step {run.loop.step} ({stop}); checkpoint {where}")
    if preempted:
        code = pre.EXIT_PREEMPTED if durable else pre.EXIT_PREEMPTED_STAGED
    else:
        code = pre.EXIT_TIME_LIMIT if stop == TIME_LIMIT else 0
    return TrainResult(run.loop.step, stop, durable, code)
