"""No pickle runs when `voxrelay export` or a resume reads a planted checkpoint (issue 33 X1), driven as a
user would: a tiny run trained 2 steps, then checkpoints committed over it by someone who can write the
bucket (manifest and sha256 matching, as a writer makes them) with a payload in each file kind that is not
safetensors or JSON. Each command exits 2 naming the file, and the payload's marker never appears."""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file

from tests.helpers.runner import CONFIG, env_for, voxrelay
from tests.helpers.tiny import tiny
from voxrelay.checkpoint.manager import MODEL_FILE, STATE_FILE, CheckpointManager
from voxrelay.checkpoint.sharded import DCP, DCP_METADATA, SHARDED, rank_files
from voxrelay.checkpoint.store import sha256_file

pytestmark = pytest.mark.slow  # tiers: see tests/conftest.py


class Payload:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return open, (str(self.marker), "w")


def _plant(run: str, tmp: Path, step: int, sharded: bool, marker: Path) -> None:
    """Commit checkpoint ``step`` with the trained one's weights: whole-model with a payload in
    train_state.pt, or sharded with a payload as .metadata."""
    found = CheckpointManager(run, reader=True, staging_dir=tmp / "r").open(2)  # the trained one
    assert found is not None
    ckpt, trained, _ = found
    kinds = {n for n in ckpt.manifest["files"] if not n.endswith((".safetensors", ".json"))}
    assert kinds == {STATE_FILE}  # every file kind a whole-model checkpoint has that could hold a pickle
    writer = CheckpointManager(run, staging_dir=tmp / f"w{step}")
    folder = writer.new_folder(step)
    extra = {k: v for k, v in ckpt.manifest.items() if k not in ("format_version", "step", "time", "files")}
    if sharded:
        dcp.save({"model": load_file(str(trained / MODEL_FILE))}, checkpoint_id=str(folder))
        (folder / DCP_METADATA).write_bytes(pickle.dumps(Payload(marker)))
        torch.save({"loop": {"step": step}}, folder / STATE_FILE)
        names, extra = [p.name for p in rank_files(folder, 0)] + [DCP_METADATA, STATE_FILE], extra | {SHARDED: DCP}
    else:
        shutil.copy(trained / MODEL_FILE, folder / MODEL_FILE)
        torch.save({"loop": {"step": step}, "rng": Payload(marker)}, folder / STATE_FILE)
        names = [MODEL_FILE, STATE_FILE]
    files = {n: {"size": (folder / n).stat().st_size, "sha256": sha256_file(folder / n)} for n in names}
    writer.save_folder(step, folder, files, extra)
    assert writer.wait(30)
    writer.close(5)


def _refused(result, named: str) -> None:
    assert result.returncode == 2, result.stderr[-2000:]
    assert named in result.stderr and "is refused" in result.stderr and "Traceback" not in result.stderr


def test_export_and_resume_refuse_a_planted_checkpoint_and_run_nothing(tmp_path):
    env = env_for(tmp_path / "cache", {"HF_HUB_OFFLINE": "1", "COLUMNS": "200"})
    root, marker = str(tmp_path / "root"), tmp_path / "pwned"
    run = f"{root}/runs/demo"
    for args in (["prepare", CONFIG, *tiny(root)], ["train", CONFIG, *tiny(root, "train.max_steps=2")]):
        assert voxrelay(*args, env=env).returncode == 0
    _plant(run, tmp_path, 3, sharded=False, marker=marker)
    _refused(voxrelay("export", run, "-o", str(tmp_path / "exp"), env=env), STATE_FILE)
    _refused(voxrelay("train", CONFIG, *tiny(root, "train.max_steps=4"), env=env), STATE_FILE)
    _plant(run, tmp_path, 4, sharded=True, marker=marker)
    _refused(voxrelay("export", run, "-o", str(tmp_path / "exp"), env=env), DCP_METADATA)
    assert not marker.exists() and not (tmp_path / "exp").exists()
    # refused, not taken for damage: nothing deleted, nothing trained on past it
    assert {c.step for c in CheckpointManager(run, reader=True, staging_dir=tmp_path / "r").store.list()} >= {3, 4}
