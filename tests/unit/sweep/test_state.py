"""A sweep worker judges an experiment's lease as the lease module does (issue 33 D2): by its renewal counter,
watched on the worker's own clock, never by the holder's wall-clock expiry."""

from __future__ import annotations

from voxrelay.checkpoint.lease import LeaseWatch, RunLease
from voxrelay.sweep import state as st
from voxrelay.sweep.spec import Experiment, Sweep


def test_an_experiment_runs_while_its_lease_is_renewed_and_resumes_once_it_is_silent(tmp_path) -> None:
    root = str(tmp_path / "root")
    e = Experiment("s-lr-1", {"train.lr": 1})
    sweep = Sweep("s.yaml", "s", "base.yaml", (), (e,))
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
