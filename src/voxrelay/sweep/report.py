"""``voxrelay sweep status SWEEP.yaml``: one line per experiment (state, step, best eval loss and WER, the
durable step, who trains it), what the WERs were measured with, and ``<root>/sweeps/<sweep>/eval.png``, the
experiments' eval curves side by side."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from voxrelay import storage
from voxrelay.monitor.sinks import read_jsonl
from voxrelay.paths import METRICS_FILE
from voxrelay.quality.plot import curves_of, newest_yardsticks, save_figure
from voxrelay.quality.scorer import ASR_KEY, said_by
from voxrelay.sweep import state as st

log = logging.getLogger(__name__)
PLOT_FILE = "eval.png"
HEADER = ("experiment", "sets", "state", "step", "best eval loss", "best WER", "durable", "holder")


@dataclass
class Row:
    state: st.ExperimentState
    curves: dict[str, list[tuple[int, float]]]
    asr: str | None = None  # what its newest WER was measured with (eval/asr)

    @property
    def step(self) -> int:
        seen = [points[-1][0] for points in self.curves.values() if points]
        return max(seen + [self.state.durable_step or 0])

    def best(self, key: str) -> tuple[int, float] | None:
        points = self.curves.get(key) or []
        return min(points, key=lambda p: p[1]) if points else None


def rows(root: str, sweep) -> list[Row]:
    found = []
    for s in st.states(root, sweep):
        records = read_jsonl(storage.join(s.run_uri, METRICS_FILE)) if s.state != st.PENDING else []
        found.append(Row(s, curves_of(records), newest_yardsticks(records).get(ASR_KEY)))
    return found


def yardsticks(found: list[Row]) -> list[str]:
    """"WER/CER by ..." once when every scored experiment used the same ASR, else one line per ASR naming its
    experiments (a WER is comparable only with one measured the same way)."""
    by: dict[str, list[str]] = {}
    for r in found:
        if r.asr:
            by.setdefault(r.asr, []).append(r.state.experiment.name)
    lines = [line for asr in by for line in said_by({ASR_KEY: asr})]
    if len(by) <= 1:
        return lines
    return [f"{line} ({', '.join(names)})" for line, names in zip(lines, by.values(), strict=True)]


def _state_text(s: st.ExperimentState) -> str:
    if s.state == st.FAILED and s.failure:  # the whole message and the output's tail: failed/<experiment>.json
        error = str(s.failure.get("error", "?"))
        return f"failed ({error if len(error) <= 90 else error[:89] + '…'})"
    if s.state == st.STOPPED:
        return f"stopped ({s.stop_reason})"
    return s.state


def _holder(s: st.ExperimentState) -> str:
    if s.holder is None:
        return "-"
    # no expiry shown: it would compare this machine's clock with the holder's (a worker watches seq instead)
    return f"{s.holder.get('host')} pid {s.holder.get('pid')} (renewal #{s.holder.get('seq', 0)})"


def _best(best: tuple[int, float] | None) -> str:
    return "-" if best is None else f"{best[1]:.3f} @{best[0]}"


def table(found: list[Row]) -> str:
    lines = [HEADER]
    for r in found:
        s = r.state
        lines.append((s.experiment.name, s.experiment.label(), _state_text(s),
                       f"{r.step}/{s.max_steps if s.max_steps is not None else '?'}",
                       _best(r.best("eval/loss")), _best(r.best("eval/wer")),
                       "-" if s.durable_step is None else str(s.durable_step), _holder(s)))
    widths = [max(len(line[i]) for line in lines) for i in range(len(HEADER))]
    text = ["  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip() for line in lines]
    ended = sum(r.state.ended for r in found)
    text.append(f"{ended} of {len(found)} ended, {sum(r.state.state == st.RUNNING for r in found)} running, "
                f"{sum(r.state.state == st.FAILED for r in found)} failed")
    return "\n".join(text + yardsticks(found))


def write_plot(root: str, sweep, found: list[Row]) -> str | None:
    """The eval curves (loss; WER where scored) of every experiment in one figure; its URI, or None (matplotlib
    missing, or no eval yet)."""
    panels = [key for key in ("eval/loss", "eval/wer") if any(r.curves.get(key) for r in found)]
    if not panels:
        return None
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.warning("no plot: matplotlib is not installed (pip install 'voxrelay[eval]')")
        return None
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4), constrained_layout=True, squeeze=False)
    for ax, key in zip(axes[0], panels, strict=True):
        for r in found:
            if r.curves.get(key):
                steps, values = zip(*r.curves[key], strict=True)
                ax.plot(steps, values, marker="o", markersize=3, label=r.state.experiment.label())
        ax.set_title(f"{key} ({sweep.name})")
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    if said := yardsticks(found):
        fig.suptitle("; ".join(said), fontsize=9)
    return save_figure(fig, storage.join(st.sweep_uri(root, sweep), PLOT_FILE))


def best_run(found: list[Row]) -> tuple[str, str] | None:
    """(run folder, why) of the experiment to listen to: the lowest eval loss among those with a committed
    checkpoint, else (no evals) the first with one; None when none has a checkpoint."""
    saved = [r for r in found if r.state.durable_step is not None]
    scored = [(best[1], best[0], r.state.run_uri) for r in saved if (best := r.best("eval/loss")) is not None]
    if scored:
        loss, step, uri = min(scored)
        return uri, f"the lowest eval loss, {loss:.3f} at step {step}"
    return (saved[0].state.run_uri, "no eval loss to rank by: the first with a checkpoint") if saved else None


def report(sweep) -> tuple[str, str | None]:
    """``sweep status``: the table, and the plot's URI (None: no plot)."""
    from voxrelay.sweep.worker import settings

    root = settings(sweep).root
    found = rows(root, sweep)
    return table(found), write_plot(root, sweep, found)
