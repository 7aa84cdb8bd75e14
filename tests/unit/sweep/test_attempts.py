"""(issue 33 W2) An experiment whose machine goes down with it (the worker never sees its trainer end) is
started again by every new VM, first, for ever: after MAX_UNSEEN_ENDS such starts in a row it is recorded as
failed and skipped; an end a worker saw starts the count again."""

from __future__ import annotations

import yaml

from tests.helpers.runner import CONFIG
from tests.helpers.tiny import tiny
from voxrelay import storage
from voxrelay.sweep import state as st
from voxrelay.sweep.spec import load_sweep
from voxrelay.sweep.worker import Worker, settings


def _sweep(tmp_path, entry: dict):
    source = tmp_path / "crashy.yaml"
    source.write_text(yaml.safe_dump({"base": CONFIG, "list": [entry]}))
    root = str(tmp_path / "root")
    return load_sweep(str(source), tiny(root, "train.max_steps=2")), root


def test_an_experiment_whose_machine_keeps_dying_is_failed_and_skipped(tmp_path):
    sweep, root = _sweep(tmp_path, {"train.lr": 1.0e-3})
    (e,) = sweep.experiments
    for _ in range(st.MAX_UNSEEN_ENDS):  # what each worker wrote before its machine went down with the trainer
        st.note_start(root, sweep, e)
    code = Worker(sweep, settings(sweep), retry_failed=False, started=0.0).run()
    assert code == 1
    failure = st.read_failure(root, sweep, e)
    assert failure["exit_code"] is None and f"started {st.MAX_UNSEEN_ENDS} times in a row" in failure["error"]
    assert not storage.exists(st.run_uri(root, e))  # not started once more: nothing of the run was written
    assert st.experiment_state(root, sweep, e).state == st.FAILED


def test_an_end_the_worker_saw_starts_the_count_again(tmp_path):
    sweep, root = _sweep(tmp_path, {"model.init_from": str(tmp_path / "no-such-model")})  # refused at once: exit 2
    (e,) = sweep.experiments
    for _ in range(st.MAX_UNSEEN_ENDS - 1):
        st.note_start(root, sweep, e)
    assert Worker(sweep, settings(sweep), retry_failed=False, started=0.0).run() == 1
    failure = st.read_failure(root, sweep, e)
    assert failure["exit_code"] == 2 and "refused" in failure["error"]  # its own failure, not the machine's
    assert st.unseen_ends(root, sweep, e) == 0
