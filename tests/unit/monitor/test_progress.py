"""The throughput report's ``data_wait`` and the progress line that says a run is data-bound."""

from __future__ import annotations

import pytest

from voxrelay.monitor import progress
from voxrelay.monitor.progress import ProgressLine, Throughput


def test_data_wait_is_the_share_of_the_window_spent_waiting_for_batches(monkeypatch):
    clock = iter([100.0, 110.0, 110.0])  # the window opens at 100, is reported at 110, the next opens at 110
    monkeypatch.setattr(progress.time, "perf_counter", lambda: next(clock))
    meter = Throughput()
    meter.add(1000, 5.0, waited=2.5)
    meter.add(1000, 5.0, waited=0.5)
    out = meter.report()
    assert out == pytest.approx({"tokens_per_sec": 200.0, "audio_sec_per_sec": 1.0, "data_wait": 0.3})
    assert meter.waited == 0.0 and meter.tokens == 0  # the next window starts empty


@pytest.mark.parametrize(("wait", "bound"), [(0.4, True), (0.1, False)])
def test_the_progress_line_says_when_the_run_is_data_bound(capsys, wait, bound):
    with ProgressLine(10, 0) as bar:
        bar.update(1, {"loss": 1.0, "data_wait": wait, "durable_step": -1}, force_print=True)
    err = capsys.readouterr().err
    assert "step 1/10 | loss 1.000" in err
    assert ("data-bound: 40% of the time waiting for batches" in err) == bound
