"""The progress line: step, loss, throughput (audio-seconds/s, tokens/s), data-bound when it is, and ETA.

A live rich bar on a terminal; a plain line every ``log_every`` steps otherwise (logs, CI).
"""

from __future__ import annotations

import sys
import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from voxrelay.monitor.limits import DATA_BOUND


class Throughput:
    """Tokens/s, audio-seconds/s and ``data_wait`` (the share of the wall time the training loop spent waiting
    for its next batch) over the window since the last report."""

    def __init__(self):
        self.tokens = 0
        self.seconds = 0.0
        self.waited = 0.0
        self.t0 = time.perf_counter()

    def add(self, tokens: int, audio_seconds: float, waited: float = 0.0) -> None:
        self.tokens += tokens
        self.seconds += audio_seconds
        self.waited += waited

    def report(self) -> dict[str, float]:
        dt = max(time.perf_counter() - self.t0, 1e-9)
        out = {"tokens_per_sec": self.tokens / dt, "audio_sec_per_sec": self.seconds / dt,
               "data_wait": min(1.0, self.waited / dt)}
        self.__init__()
        return out


class ProgressLine:
    def __init__(self, total: int, start: int, enabled: bool = True):
        self.total = total
        self.start = start
        self.enabled = enabled
        self.console = Console(stderr=True, soft_wrap=True)  # never cut a path or a message into lines
        self.live = enabled and sys.stderr.isatty()
        self.progress: Progress | None = None
        self.task = None
        self.t0 = time.time()
        self.text = ""

    def __enter__(self) -> ProgressLine:
        if self.live:
            self.progress = Progress(
                TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                TextColumn("{task.description}"), console=self.console, transient=False,
            )
            self.progress.start()
            self.task = self.progress.add_task("", total=self.total, completed=self.start)
        return self

    def __exit__(self, *exc) -> None:
        if self.progress is not None:
            self.progress.stop()

    def update(self, step: int, metrics: dict[str, float], force_print: bool = False) -> None:
        parts = [f"loss {metrics['loss']:.3f}"] if "loss" in metrics else []
        if "audio_sec_per_sec" in metrics:
            parts.append(f"{metrics['audio_sec_per_sec']:.1f} audio-s/s")
        if "tokens_per_sec" in metrics:
            parts.append(f"{metrics['tokens_per_sec']:.0f} tok/s")
        if metrics.get("data_wait", 0.0) >= DATA_BOUND:
            parts.append(f"data-bound: {100 * metrics['data_wait']:.0f}% of the time waiting for batches")
        if "durable_step" in metrics:
            durable = int(metrics["durable_step"])  # -1: nothing committed yet
            parts.append(f"durable @{durable}" if durable >= 0 else "durable @-")
        self.text = " | ".join(parts) or self.text
        if self.progress is not None:
            self.progress.update(self.task, completed=step, description=self.text)
        elif self.enabled and force_print:
            done = step - self.start
            rate = done / max(time.time() - self.t0, 1e-9)
            eta = (self.total - step) / rate if rate > 0 else float("nan")
            self.console.print(f"step {step}/{self.total} | {self.text} | ETA {eta:.0f}s", highlight=False)

    def note(self, message: str) -> None:
        if self.enabled:
            self.console.print(message, highlight=False)
