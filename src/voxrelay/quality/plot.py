"""``<run>/eval.png``: loss, WER/CER and MCD-DTW over steps, from the run's metrics (training's
evaluations) and ``voxrelay eval`` results (which win at a step both measured)."""

from __future__ import annotations

import json
import logging
import tempfile
from pathlib import Path

from voxrelay import storage
from voxrelay.paths import METRICS_FILE

log = logging.getLogger(__name__)
PLOT_FILE = "eval.png"
PANELS = (("loss", ("loss", "eval/loss")), ("WER / CER", ("eval/wer", "eval/cer")), ("MCD-DTW (dB)", ("eval/mcd_dtw",)))


def _lines(uri: str) -> list[dict]:
    if not storage.exists(uri):
        return []
    out = []
    for line in storage.read_text(uri).splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut by a kill: the others still plot
    return out


def curves(run_uri: str) -> dict[str, list[tuple[int, float]]]:
    """metric -> [(step, value)] sorted by step; on-demand results replace training's at the same step."""
    from voxrelay.quality.report import EVAL_DIR, RESULTS_FILE

    by_key: dict[str, dict[int, float]] = {}
    for record in _lines(storage.join(run_uri, METRICS_FILE)) + _lines(storage.join(run_uri, EVAL_DIR, RESULTS_FILE)):
        for key, value in record.items():
            if key not in ("step", "time") and isinstance(value, int | float) and value == value:
                by_key.setdefault(key, {})[int(record["step"])] = float(value)
    return {key: sorted(points.items()) for key, points in by_key.items()}


def write_plot(run_uri: str) -> str | None:
    """Write ``<run>/eval.png``; its URI, or None when matplotlib is missing (said once in the log)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.warning("no plot: matplotlib is not installed (pip install 'voxrelay[eval]')")
        return None
    data = curves(run_uri)
    fig, axes = plt.subplots(1, len(PANELS), figsize=(5 * len(PANELS), 3.6), constrained_layout=True)
    for ax, (title, keys) in zip(axes, PANELS, strict=True):
        for key in keys:
            if data.get(key):
                steps, values = zip(*data[key], strict=True)
                ax.plot(steps, values, marker="o" if key != "loss" else None, markersize=3, label=key)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=8)
    target = storage.join(run_uri, PLOT_FILE)
    with tempfile.TemporaryDirectory() as tmp:
        local = Path(tmp) / PLOT_FILE
        fig.savefig(local, dpi=100)
        storage.put_file(local, target)
    plt.close(fig)
    return target
