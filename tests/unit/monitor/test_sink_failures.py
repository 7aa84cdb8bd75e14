"""A sink that fails does not take the others with it, and TensorBoard takes the clip of a model that generated
no audio (it refuses clips under 2 samples)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np

from voxrelay.monitor.sinks import JsonlSink, Monitor, TensorBoardSink


def test_a_failing_sink_is_a_warning_and_the_others_still_write(tmp_path: Path, caplog) -> None:
    (tmp_path / "full").write_text("a file where the run folder should be")
    broken, kept = JsonlSink(tmp_path / "full" / "metrics.jsonl"), JsonlSink(tmp_path / "metrics.jsonl")
    caplog.set_level(logging.WARNING)
    Monitor([broken, kept], None, str(tmp_path)).log(3, {"eval/loss": 1.5})
    assert [(r["step"], r["eval/loss"]) for r in map(json.loads, kept.path.read_text().splitlines())] == [(3, 1.5)]
    assert "the metrics of step 3 were not written to JsonlSink (NotADirectoryError" in caplog.text


def test_tensorboard_takes_an_empty_clip(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    sink = TensorBoardSink(tmp_path / "tb")
    for step, n in enumerate((0, 1, 2400)):
        sink.log_audio(step, "eval/sample_0", np.zeros(n, dtype=np.float32), 24000)
    sink.close()
    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"audio": 0}).Reload()
    assert [(e.step, e.length_frames) for e in events.Audio("eval/sample_0")] == [(0, 2), (1, 2), (2, 2400)]
