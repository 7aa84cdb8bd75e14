"""A sweep worker judges an experiment's lease as the lease module does (issue 33 D2): by its renewal counter,
watched on the worker's own clock, never by the holder's wall-clock expiry."""

from __future__ import annotations

import signal
import sys

from voxrelay.checkpoint.lease import LeaseWatch, RunLease
from voxrelay.sweep import state as st
from voxrelay.sweep import worker
from voxrelay.sweep.spec import Experiment, Sweep


def test_an_experiment_runs_while_its_lease_is_renewed_and_resumes_once_it_is_silent(tmp_path) -> None:
    root = str(tmp_path / "root")
    e = Experiment("s-lr-1", {"train.lr": 1})
    sweep = Sweep("s.yaml", "s", "base.yaml", "0" * 8, (), (e,))
    wall = [1_000_000.0]
    holder = RunLease(st.run_uri(root, e), 9, lambda: wall[0] - 3600)  # its clock an hour behind the worker's
    holder.acquire()
    mono = [0.0]
    watch = LeaseWatch(lambda: mono[0])
    for _ in range(5):  # renewed every 3 s: running, though its `expires` is an hour past by the worker's clock
        assert st.experiment_state(root, sweep, e, watch, 9).state == st.RUNNING
        mono[0] += 3
        holder.renew()
    assert st.experiment_state(root, sweep, e, watch, 9).state == st.RUNNING
    mono[0] += 8.9
    assert st.experiment_state(root, sweep, e, watch, 9).state == st.RUNNING
    mono[0] += 0.2  # silent for its ttl on the worker's clock: its machine is gone
    assert st.experiment_state(root, sweep, e, watch, 9).state == st.RESUMABLE


def test_a_sweep_stops_a_child_whose_lease_goes_unrenewed(tmp_path) -> None:
    """Issue 33 H2: the worker's wait on its trainer is bounded by the lease rule. The child hangs for real (an
    Event never set); the lease it took (here: taken for it, then never renewed: no progress) stays silent on
    the worker's clock, advanced by each watchdog poll, until the worker stops the child."""
    run = str(tmp_path / "runs" / "r")
    before = None  # no lease before the child started
    trainer = RunLease(run, 9)
    mono = [0.0]
    watch = LeaseWatch(lambda: mono[0])

    def hung() -> bool:
        mono[0] += 1  # a poll: one second on the worker's clock
        if mono[0] == 4:
            trainer.renew()  # one step made: renewed, the silence counts again from here
        return worker.stalled(watch, run, before, 9)

    trainer.acquire()
    child = worker.Child([sys.executable, "-c", "import threading; threading.Event().wait()"], hung, 0.01)
    code = child.run()
    assert child.was_hung and code == -signal.SIGTERM
    assert 4 + 9 <= mono[0] <= 4 + 9 + 2  # not before the lease's ttl after its last renewal


def test_a_lease_the_child_has_not_taken_yet_is_not_its_hang(tmp_path) -> None:
    """While the child watches an old holder's silent lease (before taking it over), that lease is not the
    child's: the worker does not count its silence."""
    run = str(tmp_path / "runs" / "r")
    old = RunLease(run, 9)
    old.acquire()
    mono = [0.0]
    watch = LeaseWatch(lambda: mono[0])
    for _ in range(20):
        assert not worker.stalled(watch, run, old.record["token"], 9)
        mono[0] += 1
