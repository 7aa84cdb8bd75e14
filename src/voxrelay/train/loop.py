"""The training loop. It receives a built :class:`~voxrelay.train.build.Run` and fits on a screen."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
from dataclasses import dataclass

import torch

from voxrelay.checkpoint import preemption as pre
from voxrelay.config import parse_duration
from voxrelay.models.base import LOSS_TOKENS
from voxrelay.monitor.progress import ProgressLine, Throughput
from voxrelay.train.build import Run
from voxrelay.train.evaluate import evaluate
from voxrelay.train.memory import gpu_memory, oom_advice
from voxrelay.train.resume import any_rank, save_checkpoint

log = logging.getLogger(__name__)

TIME_LIMIT, TOTAL_TIME_LIMIT, EARLY_STOP = pre.TIME_LIMIT, pre.TOTAL_TIME_LIMIT, "early stopping"
NON_FINITE, STORAGE, OUT_OF_MEMORY = "non-finite steps", "storage error", "out of memory"
CLEAN_STOPS = (TIME_LIMIT, TOTAL_TIME_LIMIT, EARLY_STOP, NON_FINITE, OUT_OF_MEMORY)  # others are preemptions


@dataclass
class StepStats:
    loss: float
    tokens: int
    audio_seconds: float
    grad_norm: float
    finite: bool = True  # False: NaN/inf loss or gradient norm, the optimizer step was skipped


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
    local_tokens = sum(int(b.pop(LOSS_TOKENS)) for b in micro_batches)  # counted by the family's collate
    total = local_tokens
    if acc.num_processes > 1:
        total = int(acc.reduce(torch.tensor(local_tokens, device=device), "sum"))
    scale = acc.num_processes / max(total, 1)  # DDP averages gradients over processes
    loss_sum = 0.0
    for i, batch in enumerate(micro_batches):
        batch = {k: v.to(device) for k, v in batch.items()}
        sync = contextlib.nullcontext() if i == len(micro_batches) - 1 else acc.no_sync(run.module)
        with sync, acc.autocast():
            loss = run.model.loss(run.module, batch).loss_sum
            acc.backward(loss * scale)
        loss_sum += float(loss.detach())
    # the norm is computed even without clipping (max_norm=inf): a NaN/inf one must not reach the weights
    clip = run.cfg.train.clip_norm if run.cfg.train.clip_norm is not None else float("inf")
    grad_norm = float(acc.clip_grad_norm_(run.module.parameters(), clip))
    # with fp16 an inf gradient is the GradScaler's business (it skips the step and lowers the scale)
    grads_ok = math.isfinite(grad_norm) or acc.scaler is not None
    finite = not any_rank(not (math.isfinite(loss_sum) and grads_ok), device)
    if finite:
        run.optimizer.step()
        run.scheduler.step()
    run.optimizer.zero_grad(set_to_none=True)
    return StepStats(loss_sum / max(local_tokens, 1), local_tokens, seconds, grad_norm, finite)


def _due(step: int, every: int | None) -> bool:
    return every is not None and step % every == 0


def train(run: Run) -> TrainResult:
    """Train until ``train.max_steps``, a stop signal, a time limit, early stopping or too many
    non-finite steps in a row."""
    tc, ck, loop = run.cfg.train, run.cfg.checkpoint, run.loop
    deadline = pre.Deadline(parse_duration(tc.time_limit), parse_duration(tc.total_time_limit),
                            pre.process_start_time())
    trigger = pre.SaveTrigger(ck.every_steps, ck.every_minutes, parse_duration(ck.adaptive_mtbf))
    meter, batches, t0, wall0 = Throughput(), iter(run.stream), time.time(), loop.wall_time
    if run.resumed_from is None and tc.eval_every:
        run.monitor.log(0, evaluate(run, 0))  # the untrained baseline
    main = run.accelerator.is_main_process
    with pre.PreemptionWatcher(ck.preemption_poll, metadata_url=ck.metadata_url) as watcher, \
            ProgressLine(tc.max_steps, loop.step, enabled=main) as bar:
        stop = _stop_reason(run, watcher, deadline, 0.0)  # e.g. the total budget was spent before
        while loop.step < tc.max_steps and stop is None:
            started, cursor = time.time(), run.stream.state_dict()
            try:
                stats = train_step(run, [next(batches) for _ in range(tc.grad_accum)])
            except torch.OutOfMemoryError as e:
                return _out_of_memory(run, e, cursor, bar)
            loop.advance(stats.tokens, stats.audio_seconds, wall0 + time.time() - t0, stats.finite)
            meter.add(stats.tokens, stats.audio_seconds)
            _log_step(run, stats, meter, bar)
            results = {}
            if _due(loop.step, tc.eval_every) or loop.step == tc.max_steps:
                results = evaluate(run, loop.step)
                run.monitor.log(loop.step, results)
                bar.note(f"eval @{loop.step}: " + ", ".join(f"{k} {v:.3f}" for k, v in results.items()))
                loop.record_eval(results["eval/loss"])
            stop = _stop_reason(run, watcher, deadline, time.time() - started)
            last = stop is not None or loop.step == tc.max_steps
            new_best = bool(results) and ck.keep_best and loop.evals_since_best == 0  # keep_best needs it saved
            if trigger.due(loop.step) or last or new_best:
                trigger.saved(save_checkpoint(run, results, background=not last, stopped=stop))
                run.monitor.sync()
        return _finish(run, stop, bar)  # still watching: a second Ctrl-C while waiting aborts


def _out_of_memory(run: Run, err: torch.OutOfMemoryError, cursor: dict, bar: ProgressLine) -> TrainResult:
    """A step ran out of memory: free it, save the state of the last complete step (its data cursor: the
    failed step's batches are trained again on resume) and stop with the plan's next-best strategy. With
    several processes the others wait in a collective the failed one will never join: it exits at once
    (the last committed checkpoint stays durable; torchrun stops the rest)."""
    run.optimizer.zero_grad(set_to_none=True)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    run.stream.load_state_dict(cursor)
    acc = run.accelerator
    advice = oom_advice(run.cfg, run.index or {}, acc.num_processes, gpu_memory())
    log.error("step %d ran out of memory (%s); %s", run.loop.step + 1, str(err).split("\n")[0][:200], advice)
    if acc.num_processes > 1:
        logging.shutdown()
        os._exit(pre.EXIT_OUT_OF_MEMORY)
    save_checkpoint(run, {}, background=False, stopped=OUT_OF_MEMORY)
    return _finish(run, OUT_OF_MEMORY, bar)


def _log_step(run: Run, stats: StepStats, meter: Throughput, bar: ProgressLine) -> None:
    loop, tc = run.loop, run.cfg.train
    durable = run.checkpoints.durable_step
    metrics = {"loss": stats.loss, "durable_step": -1 if durable is None else durable}
    if not stats.finite:
        log.warning("step %d: non-finite loss (%s) or gradient norm (%s); the optimizer step was skipped "
                    "(%d in a row, the run stops at train.max_bad_steps=%d)", loop.step, stats.loss,
                    stats.grad_norm, loop.bad_in_a_row, tc.max_bad_steps)
    if _due(loop.step, tc.log_every) or loop.step == tc.max_steps or not stats.finite:
        metrics |= meter.report() | {"lr": run.scheduler.get_last_lr()[0], "grad_norm": stats.grad_norm,
                                     "epoch": run.stream.cursor.epoch, "bad_steps": loop.bad_steps}
        run.monitor.log(loop.step, metrics)
    bar.update(loop.step, metrics, force_print=_due(loop.step, tc.log_every))


def _stop_reason(run: Run, watcher: pre.PreemptionWatcher, deadline: pre.Deadline, step_s: float) -> str | None:
    loop, patience = run.loop, run.cfg.train.early_stopping_patience
    local = watcher.stop_reason or deadline.reached(loop.wall_time, step_s)
    if local is None and run.checkpoints.uploader.fatal is not None:
        local = STORAGE
    if local is None and loop.bad_in_a_row >= run.cfg.train.max_bad_steps:
        local = NON_FINITE
    if local is None and patience is not None and loop.evals_since_best >= patience:
        local = EARLY_STOP
    if any_rank(local is not None, run.accelerator.device):  # every rank stops at the same step
        return local or "another process stopped"
    return None


def _finish(run: Run, stop: str | None, bar: ProgressLine) -> TrainResult:
    """Wait for the last upload (bounded: checkpoint.grace_seconds after a signal, else
    checkpoint.final_upload_timeout), close the sinks, and pick the exit code."""
    ck, step = run.cfg.checkpoint, run.loop.step
    preempted = stop is not None and stop not in CLEAN_STOPS
    durable = True
    if run.accelerator.is_main_process:
        if run.checkpoints.uploader.pending or run.checkpoints.uploader.snapshot:
            bar.note(f"waiting for the upload of step {step} to {run.cfg.run_uri}")
        durable = run.checkpoints.close(ck.grace_seconds if preempted else ck.final_upload_timeout)
        run.monitor.close()
    durable = not any_rank(not durable, run.accelerator.device)
    if not durable and run.accelerator.is_main_process:
        staged = run.checkpoints.staging.list()
        where = staged[0].uri if staged else str(run.checkpoints.staging.folder)
        error = run.checkpoints.uploader.fatal or run.checkpoints.uploader.last_error or "the upload did not finish"
        bar.note(f"the checkpoint of step {step} is only on this machine, at {where} ({error}). Run the same "
                 "command again on this machine to upload it and continue")
    elif stop is not None:
        bar.note(f"stopped at step {step} ({stop}); checkpoint committed")
    if stop == NON_FINITE:
        bar.note(f"{run.loop.bad_in_a_row} steps in a row had a non-finite loss or gradient norm (each was "
                 f"skipped; {run.loop.bad_steps} in all), so the checkpoint of step {step} holds the last good "
                 "weights. Lower train.lr, keep train.clip_norm on, try train.precision=bf16 instead of fp16, "
                 "or look for broken rows in the data")
    return TrainResult(step, stop, durable, _exit_code(stop, preempted, durable))


def _exit_code(stop: str | None, preempted: bool, durable: bool) -> int:
    if not durable:
        return pre.EXIT_PREEMPTED_STAGED
    if preempted:
        return pre.EXIT_PREEMPTED
    return {TIME_LIMIT: pre.EXIT_TIME_LIMIT, TOTAL_TIME_LIMIT: pre.EXIT_TIME_LIMIT,
            NON_FINITE: pre.EXIT_NON_FINITE, OUT_OF_MEMORY: pre.EXIT_OUT_OF_MEMORY}.get(stop, 0)
