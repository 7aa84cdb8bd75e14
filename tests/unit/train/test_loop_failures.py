"""Failures that surface instead of hiding: saves that keep failing stop the run (exit 74, final: a new
machine would not do better; the reason named) rather than training on for hours with nothing to resume
from; an exception out of the loop still closes the checkpoint manager, so the last good checkpoint finishes
uploading, and releases the lease."""

from __future__ import annotations

import threading
import time

import pytest

from tests.helpers.tiny import NO_EVALS
from voxrelay.checkpoint.lease import read_lease
from voxrelay.checkpoint.stops import EXIT_FAILED_FOR_GOOD


def _run(tiny_prepared, *extra):
    from voxrelay.train.build import build_run

    return build_run(tiny_prepared("train.max_steps=50", NO_EVALS, "train.log_every=1", *extra))


def test_saves_that_keep_failing_stop_the_run_naming_why(tmp_path, tiny_prepared, capsys):
    from voxrelay.train.loop import train
    from voxrelay.train.stops import SAVES_FAILED

    run = _run(tiny_prepared, "checkpoint.every_steps=1", "checkpoint.max_failed_saves=3")
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("the staging disk is gone")  # a file where the staging folder should be
    run.checkpoints.staging.folder = blocker / "staging"
    result = train(run)
    assert result.stop_reason == SAVES_FAILED and result.exit_code == EXIT_FAILED_FOR_GOOD
    # the saves of steps 1-3 failed; the decision after step 4 stops, and its last save attempt fails too
    assert result.step == 4 and not result.durable
    out = " ".join(capsys.readouterr().err.split())
    assert "4 save(s) in a row failed" in out and "checkpoint.max_failed_saves" in out and "NotADirectoryError" in out


def test_an_exception_in_the_loop_still_uploads_the_last_checkpoint_and_releases_the_lease(tiny_prepared,
                                                                                         monkeypatch):
    from voxrelay.train.loop import train

    run = _run(tiny_prepared, "checkpoint.every_steps=2", "train.eval_synth=0")
    crashed = threading.Event()
    upload = run.checkpoints.store.upload

    def slow_upload(folder, manifest):  # a bucket that takes a moment: still uploading when the crash comes
        crashed.wait(30)
        time.sleep(0.3)
        return upload(folder, manifest)

    monkeypatch.setattr(run.checkpoints.store, "upload", slow_upload)
    calls = {"n": 0}

    def crash_on_third_step(module, inputs, output):
        calls["n"] += module.training  # training steps only, not the evaluation's forwards
        if calls["n"] == 3 and module.training:
            crashed.set()
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return output

    run.model.module.get_input_embeddings().register_forward_hook(crash_on_third_step)
    with pytest.raises(RuntimeError, match="illegal memory access"):
        train(run)
    # when the error leaves train(), the checkpoint of step 2 is committed (the process may exit right away)
    assert [c.step for c in run.checkpoints.store.list()] == [2]
    assert read_lease(run.cfg.run_uri)["released"] is True


def test_an_eval_that_fails_at_the_end_of_training_never_costs_the_checkpoint(tiny_prepared, monkeypatch, caplog):
    """Upstream users report evaluation crashing at the end of training and losing the run: here the last
    step's eval fails, the failure is reported, and the last checkpoint is committed all the same."""
    import voxrelay.train.loop as loop_module

    run = _run(tiny_prepared, "train.max_steps=3", "checkpoint.every_steps=1000", "train.eval_synth=0")

    def broken_eval(run, step):
        raise RuntimeError("the Whisper model cannot be loaded")

    monkeypatch.setattr(loop_module, "evaluate", broken_eval)
    result = loop_module.train(run)
    assert result.exit_code == 0 and result.step == 3 and result.durable
    assert run.checkpoints.durable_step == 3
    assert "the eval of step 3 failed (RuntimeError: the Whisper model cannot be loaded)" in caplog.text
