"""A reader (synthesize, export, eval, status) beside a trainer on its machine never writes or deletes in the
trainer's staging folder and never commits (issue 33 D4)."""

import uuid

import pytest
import torch

from voxrelay.checkpoint.manager import MODEL_FILE, STATE_FILE, CheckpointManager, model_writer, state_writer
from voxrelay.checkpoint.store import ELSEWHERE, make_manifest, verify_folder


def _writers(step):
    return {MODEL_FILE: model_writer({"w": torch.full((3,), float(step))}), STATE_FILE: state_writer({"step": step})}


@pytest.fixture
def trainer(tmp_path, monkeypatch):
    """A trainer's manager with steps 1 and 2 committed, both readers and trainer on one $VOXRELAY_CACHE."""
    monkeypatch.setenv("VOXRELAY_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    m = CheckpointManager(f"memory://read-{uuid.uuid4().hex}", keep_last=5)
    for step in (1, 2):
        m.save(step, _writers(step))
        assert m.wait(30)
    m.close(5)
    return m


def _snapshot(folder):
    return {p.relative_to(folder): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.mark.parametrize("step", [None, 1, 2])
def test_a_reader_leaves_the_copy_a_trainer_is_verifying(trainer, step):
    resuming = CheckpointManager(trainer.run_uri)  # the trainer's next session: fetched step 2, verifying it
    ckpt, folder = resuming.latest_valid()
    assert ckpt.step == 2 and folder.parent == resuming.fetched_dir
    before = _snapshot(trainer.staging.folder)
    reader = CheckpointManager(trainer.run_uri, reader=True)
    got, weights, _ = reader.load_model(step)
    assert got.step == (step or 2) and torch.equal(weights["w"], torch.full((3,), float(step or 2)))
    assert _snapshot(trainer.staging.folder) == before  # not one file written or deleted in the staging folder
    verify_folder(folder, ckpt.manifest)  # the trainer's copy is whole: it resumes from step 2, not step 1
    assert resuming.load()[0].step == 2
    assert not any((reader.staging.folder.parent.parent / "read").rglob("*.safetensors"))  # its own copy is gone


def test_a_reader_never_commits_nor_removes_a_staged_multi_machine_checkpoint(trainer):
    """Step 3 staged on rank 0's machine, its other machine's shard already in the bucket: only the trainer (holding
    the lease) may commit it; a reader loads step 2 and leaves step 3 staged and uncommitted."""
    folder, shard = trainer.staging.new_folder(3), "__1_0.distcp"
    for name, write in _writers(3).items():
        write(folder / name)
    (folder / shard).write_bytes(b"the other machine's shard")
    manifest = make_manifest(3, folder, [MODEL_FILE, STATE_FILE, shard], {ELSEWHERE: [shard]})
    trainer.store.upload_part(folder, 3, {shard: manifest["files"][shard]})  # the other machine uploaded its part
    (folder / shard).unlink()  # it was staged on that machine's disk, not here
    trainer.staging.commit(3, folder, manifest)
    before = _snapshot(trainer.staging.folder)
    reader = CheckpointManager(trainer.run_uri, reader=True)
    assert reader.load_model()[0].step == 2
    assert sorted(c.step for c in trainer.store.list()) == [1, 2]  # step 3 not committed by the reader
    assert _snapshot(trainer.staging.folder) == before
    assert CheckpointManager(trainer.run_uri).latest_valid()[0].step == 3  # the trainer commits it (it may)


def test_a_reader_cannot_save(trainer):
    with pytest.raises(RuntimeError, match="never saves"):
        CheckpointManager(trainer.run_uri, reader=True).save(3, _writers(3))
