"""The training loop. It receives a built :class:`~voxrelay.train.build.Run` and fits on a screen."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

import torch

from voxrelay.config import parse_duration
from voxrelay.monitor.progress import ProgressLine
from voxrelay.train.build import Run
from voxrelay.train.evaluate import evaluate


@dataclass
class StepStats:
    loss: float
    tokens: int
    audio_seconds: float
    grad_norm: float


def train_step(run: Run, micro_batches: list[dict]) -> StepStats:
    """One optimizer step over ``grad_accum`` micro-batches; the loss is normalised by the number
    of loss tokens of the whole step, over every process (not averaged per micro-batch)."""
    acc, device = run.accelerator, run.accelerator.device
    seconds = sum(b.pop("audio_seconds") for b in micro_batches)
    local_tokens = sum(int((b["labels"][:, 1:] != -100).sum()) for b in micro_batches)
    total = int(acc.reduce(torch.tensor(local_tokens, device=device), "sum")) if acc.num_processes > 1 else local_tokens
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


def train(run: Run) -> int:
    """Train until ``train.max_steps`` (or ``train.time_limit``); returns the last step."""
    tc, ck, loop = run.cfg.train, run.cfg.checkpoint, run.loop
    limit = parse_duration(tc.time_limit)
    t_start, base_wall, last_save = time.time(), loop.wall_time, time.time()
    window = {"tokens": 0, "seconds": 0.0, "t": time.time()}
    batches = iter(run.stream)
    main = run.accelerator.is_main_process
    if loop.step == 0 and tc.eval_every:
        run.monitor.log(0, evaluate(run, 0))  # the untrained baseline
    with ProgressLine(tc.max_steps, loop.step, enabled=main) as bar:
        while loop.step < tc.max_steps:
            stats = train_step(run, [next(batches) for _ in range(tc.grad_accum)])
            loop.step += 1
            loop.wall_time = base_wall + time.time() - t_start
            loop.tokens_seen += stats.tokens
            loop.audio_seconds_seen += stats.audio_seconds
            window["tokens"] += stats.tokens
            window["seconds"] += stats.audio_seconds
            metrics = {"loss": stats.loss}
            if _due(loop.step, tc.log_every) or loop.step == tc.max_steps:
                dt = max(time.time() - window["t"], 1e-9)
                metrics |= {
                    "lr": run.scheduler.get_last_lr()[0], "grad_norm": stats.grad_norm,
                    "tokens_per_sec": window["tokens"] / dt, "audio_sec_per_sec": window["seconds"] / dt,
                    "epoch": run.stream.cursor.epoch,
                }
                run.monitor.log(loop.step, metrics)
                window = {"tokens": 0, "seconds": 0.0, "t": time.time()}
            bar.update(loop.step, metrics, force_print=_due(loop.step, tc.log_every))
            if _due(loop.step, tc.eval_every) or loop.step == tc.max_steps:
                results = evaluate(run, loop.step)
                run.monitor.log(loop.step, results)
                bar.note(f"eval @{loop.step}: " + ", ".join(f"{k} {v:.3f}" for k, v in results.items()))
            out_of_time = limit is not None and loop.wall_time > limit
            by_minutes = ck.every_minutes is not None and time.time() - last_save > ck.every_minutes * 60
            if _due(loop.step, ck.every_steps) or by_minutes or out_of_time or loop.step == tc.max_steps:
                save(run)
                last_save = time.time()
            if out_of_time:
                bar.note(f"train.time_limit {tc.time_limit} reached: saved at step {loop.step}, exiting")
                break
    run.monitor.close()
    return loop.step


def save(run: Run) -> None:
    if run.accelerator.is_main_process:
        run.checkpoints.save(run.loop.step, run.model_state(), run.train_state())
        run.monitor.sync()
    run.accelerator.wait_for_everyone()
