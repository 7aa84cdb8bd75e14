"""``<run>/eval.png``: loss, WER/CER/speaker similarity, MCD-DTW (and UTMOS when measured) over steps: lines
for training's evaluations (``metrics.jsonl``), open markers for ``voxrelay eval`` results (often more texts)."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

from voxrelay import storage
from voxrelay.monitor.sinks import read_jsonl
from voxrelay.paths import METRICS_FILE

log = logging.getLogger(__name__)
PLOT_FILE = "eval.png"
PANELS = (
    ("loss (nats)", ("loss", "eval/loss", "eval/text_gain")),
    ("WER / CER / speaker similarity", ("eval/wer", "eval/cer", "eval/speaker_sim")),
    ("MCD-DTW (dB)", ("eval/mcd_dtw",)),
)
UTMOS_PANEL = ("UTMOS (predicted MOS, 1-5)", ("eval/utmos",))  # drawn when a run measured it (eval.utmos)


def curves(uri: str) -> dict[str, list[tuple[int, float]]]:
    """metric -> [(step, value)] sorted by step, from a JSONL of metrics (the last value at a step wins)."""
    return curves_of(read_jsonl(uri))


def curves_of(records: list[dict]) -> dict[str, list[tuple[int, float]]]:
    """:func:`curves` of records already read."""
    by_key: dict[str, dict[int, float]] = {}
    for record in records:
        for key, value in record.items():
            if key not in ("step", "time") and isinstance(value, int | float) and value == value:
                by_key.setdefault(key, {})[int(record["step"])] = float(value)
    return {key: sorted(points.items()) for key, points in by_key.items()}


def newest_yardsticks(records: list[dict]) -> dict[str, str]:
    """The newest value of each yardstick key (``eval/asr``, ``eval/mos_model``) in ``records``, oldest first."""
    from voxrelay.quality.scorer import YARDSTICKS

    newest = {k: next((r[k] for r in reversed(records) if r.get(k)), None) for k in YARDSTICKS}
    return {k: v for k, v in newest.items() if v}


def write_plot(run_uri: str) -> str | None:
    """Write ``<run>/eval.png``; its URI, or None when matplotlib is missing (said once in the log)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.warning("no plot: matplotlib is not installed (pip install 'voxrelay[eval]')")
        return None
    from voxrelay.quality.report import EVAL_DIR, RESULTS_FILE
    from voxrelay.quality.scorer import said_by

    logged = read_jsonl(storage.join(run_uri, METRICS_FILE))
    results = read_jsonl(storage.join(run_uri, EVAL_DIR, RESULTS_FILE))
    training, on_demand = curves_of(logged), curves_of(results)
    newest = newest_yardsticks(logged + results)
    panels = PANELS + ((UTMOS_PANEL,) if training.get("eval/utmos") or on_demand.get("eval/utmos") else ())
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.6), constrained_layout=True)
    for ax, (title, keys) in zip(axes, panels, strict=True):
        for key in keys:
            color = None
            if training.get(key):
                steps, values = zip(*training[key], strict=True)
                (line,) = ax.plot(steps, values, marker="o" if key != "loss" else None, markersize=3, label=key)
                color = line.get_color()
            if on_demand.get(key):
                steps, values = zip(*on_demand[key], strict=True)
                ax.plot(steps, values, linestyle="none", marker="D", markersize=6, markerfacecolor="none",
                        color=color, label=f"{key} (voxrelay eval)")
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=8)
    if said := said_by(newest):
        fig.suptitle("; ".join(said), fontsize=9)
    return save_figure(fig, storage.join(run_uri, PLOT_FILE))


def save_figure(fig, target: str) -> str:
    """Write a matplotlib figure as a PNG to ``target`` (any storage), close it, and return ``target``."""
    import matplotlib.pyplot as plt

    with tempfile.TemporaryDirectory() as tmp:
        local = Path(tmp) / Path(target).name
        fig.savefig(local, dpi=100)
        storage.put_file(local, target)
    plt.close(fig)
    return target
