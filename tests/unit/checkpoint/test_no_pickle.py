"""No pickle runs on any load path (issue 33 X1): a payload planted in each file kind of a sharded checkpoint
(``.metadata``, a BYTE_IO entry of a ``__*.distcp``, ``train_state.pt``), with a manifest that matches it
(whoever writes the bucket writes the manifest too), is refused with an error naming the file on the export
path (``load_model``) and the resume path (``open`` + the DCP load a sharded resume does); its code never runs.
The whole-model checkpoint's kinds are planted through the CLI in tests/integration/test_no_pickle_cli.py."""

from __future__ import annotations

import pickle
import uuid
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from voxrelay.checkpoint import safe_dcp
from voxrelay.checkpoint.manager import STATE_FILE, CheckpointManager
from voxrelay.checkpoint.safe_dcp import UnsafeCheckpoint
from voxrelay.checkpoint.sharded import DCP, DCP_METADATA, SHARDED, rank_files
from voxrelay.checkpoint.store import CheckpointError, sha256_file


class Payload:
    """Creates ``marker`` when unpickled: what a planted file would do with os.system instead."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return open, (str(self.marker), "w")


def _model(step: int) -> dict[str, torch.Tensor]:
    return {"layer.weight": torch.full((4, 3), float(step)), "norm.weight": torch.arange(3.0) + step}


def _save(mgr: CheckpointManager, step: int, plant: str | None, marker: Path) -> None:
    """A sharded checkpoint as the trainer writes it (model, optimizer with a BYTE_IO param_groups value, train
    state), with ``plant`` ("metadata", "bytes", "state") replaced by a payload before it is hashed."""
    folder = mgr.new_folder(step)
    lr = Payload(marker) if plant == "bytes" else 0.5  # DCP writes a non-tensor value with torch.save
    dcp.save({"model": _model(step), "optim": {"exp_avg": torch.ones(5), "param_groups": [{"lr": lr}]}},
             checkpoint_id=str(folder))
    torch.save({"loop": {"step": step}, "family": {}}, folder / STATE_FILE)
    if plant == "metadata":
        (folder / DCP_METADATA).write_bytes(pickle.dumps(Payload(marker)))
    if plant == "state":
        torch.save({"loop": {"step": step}, "family": {}, "rng": Payload(marker)}, folder / STATE_FILE)
    names = [p.name for p in rank_files(folder, 0)] + [DCP_METADATA, STATE_FILE]
    files = {n: {"size": (folder / n).stat().st_size, "sha256": sha256_file(folder / n)} for n in names}
    mgr.save_folder(step, folder, files, {SHARDED: DCP})
    assert mgr.wait(30)


@pytest.fixture
def run_uri(tmp_path):
    return f"memory://no-pickle-{uuid.uuid4().hex}"


@pytest.mark.parametrize(("plant", "named"), [("metadata", DCP_METADATA), ("bytes", "'optim.param_groups.0.lr'"),
                                              ("state", STATE_FILE)])
def test_a_payload_in_any_sharded_file_never_runs_on_export_or_resume(tmp_path, run_uri, plant, named):
    marker = tmp_path / "pwned"
    writer = CheckpointManager(run_uri, staging_dir=tmp_path / "staging")
    _save(writer, 10, plant, marker)
    writer.close(5)
    exporter = CheckpointManager(run_uri, reader=True, staging_dir=tmp_path / "reader")
    if plant == "bytes":  # export reads the model's entries only: the optimizer's are never opened
        assert torch.equal(exporter.load_model()[1]["norm.weight"], _model(10)["norm.weight"])
    else:
        with pytest.raises(UnsafeCheckpoint, match=rf"{named}.* is refused|is refused: .*{named}"):
            exporter.load_model()  # what export and synthesize call
    resumer = CheckpointManager(run_uri, staging_dir=tmp_path / "resume")
    with pytest.raises(UnsafeCheckpoint, match=rf"{named}.* is refused|is refused: .*{named}"):
        _, folder, _ = resumer.open()  # the train state, then DCP's load into the sharded model
        safe_dcp.load({"model": _model(0), "optim": {"exp_avg": torch.zeros(5),
                                                     "param_groups": [{"lr": 0.0}]}}, folder)
    assert not marker.exists()


def test_an_honest_sharded_checkpoint_loads_its_non_tensor_values(tmp_path, run_uri):
    writer = CheckpointManager(run_uri, staging_dir=tmp_path / "staging")
    _save(writer, 10, None, tmp_path / "unused")
    _, folder, state = writer.open()
    into = {"model": _model(0), "optim": {"exp_avg": torch.zeros(5), "param_groups": [{"lr": 0.0}]}}
    safe_dcp.load(into, folder)
    assert into["optim"]["param_groups"][0]["lr"] == 0.5 and torch.equal(into["model"]["norm.weight"], _model(10)[
        "norm.weight"]) and state["loop"]["step"] == 10
    writer.close(5)


def test_metadata_naming_a_file_outside_its_folder_is_refused(tmp_path):
    dcp.save({"model": _model(1)}, checkpoint_id=str(tmp_path / "ck"))
    meta = safe_dcp.read_metadata(tmp_path / "ck")
    for info in meta.storage_data.values():
        info.relative_path = "../../etc/passwd"
    (tmp_path / "ck" / DCP_METADATA).write_bytes(pickle.dumps(meta))
    with pytest.raises(UnsafeCheckpoint, match=r"names '../../etc/passwd', not a file of its folder"):
        safe_dcp.read_metadata(tmp_path / "ck")
    (tmp_path / "ck" / DCP_METADATA).write_bytes(b"\x80\x05not a pickle")
    with pytest.raises(CheckpointError, match=r"\.metadata is not DCP metadata"):
        safe_dcp.read_metadata(tmp_path / "ck")
