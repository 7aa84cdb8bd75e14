"""A job over several machines resuming from a checkpoint staged on rank 0's disk only (its upload did not
finish before the last session died): rank 0 commits it before the others look, since they cannot read
rank 0's disk; if the bucket refuses it, every rank resumes from the newest committed checkpoint instead."""

from __future__ import annotations

from pathlib import Path

import torch

from voxrelay.checkpoint.manager import MODEL_FILE, STATE_FILE, CheckpointManager, model_writer, state_writer
from voxrelay.train.build import commit_before_others_look, spans_machines


def _stage(mgr: CheckpointManager, step: int) -> None:
    weights = {"w": torch.full((3,), float(step))}
    mgr.staging.stage(step, {MODEL_FILE: model_writer(weights), STATE_FILE: state_writer({"step": step})}, {})


def test_a_checkpoint_staged_on_one_machine_is_committed_before_the_others_look(tmp_path: Path) -> None:
    run = tmp_path / "bucket/runs/r"
    mgr = CheckpointManager(str(run), staging_dir=tmp_path / "staging")
    _stage(mgr, 4)
    found = mgr.load()
    assert found[0].step == 4 and not found[0].durable and mgr.store.list() == []
    other_machine = CheckpointManager(str(run), staging_dir=tmp_path / "other-staging")
    assert other_machine.load() is None  # what another machine sees before the commit
    again = commit_before_others_look(mgr, found)
    assert again[0].step == 4
    ckpt, weights, _ = other_machine.load(4)  # now it reads the same checkpoint from the bucket
    assert ckpt.durable and torch.equal(weights["w"], torch.full((3,), 4.0))


def test_a_bucket_that_refuses_it_falls_back_to_the_newest_committed(tmp_path: Path) -> None:
    run = tmp_path / "bucket/runs/r"
    mgr = CheckpointManager(str(run), staging_dir=tmp_path / "staging")
    _stage(mgr, 2)
    mgr.store.upload(Path(mgr.staging.list()[0].uri), mgr.staging.list()[0].manifest)
    _stage(mgr, 4)
    staged = mgr.load()
    (Path(staged[0].uri) / MODEL_FILE).unlink()  # the upload fails (as a refusing bucket's would)
    found = commit_before_others_look(mgr, staged)
    assert found[0].step == 2 and [c.step for c in mgr.store.list()] == [2]  # committed: every machine reads it


def test_spans_machines(monkeypatch) -> None:
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert not spans_machines(8) and spans_machines(16)
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert not spans_machines(4)  # not under torchrun: one machine
