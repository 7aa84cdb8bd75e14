"""No name read from the bucket escapes its folder (issue 33 X2): object keys listed and names inside the bucket's
JSON files are joined through one checked join; a planted ``..``, absolute name or stray separator is refused
(exit 2 naming it and where it came from) and nothing is written outside the folder."""

from __future__ import annotations

import pytest

from voxrelay import storage
from voxrelay.errors import UserError
from voxrelay.models import hub_cache

COMMIT = "0123456789abcdef0123456789abcdef01234567"
ESCAPE = "../../../../../escaped.txt"  # from <hub>/models--a--b/snapshots/<commit>/ up past the hub cache


@pytest.mark.parametrize("name, single, why", [
    ("../x", False, "climbs out"),
    ("a/../../x", False, "climbs out"),
    ("/etc/passwd", False, "absolute"),
    ("a\\..\\x", False, "backslash"),
    ("a\0b", False, "NUL"),
    ("a/b", True, "single file or folder name"),
    ("a//b", False, "empty"),
    ("", False, "not a name"),
])
def test_the_checked_join_refuses_names_that_leave_their_folder(tmp_path, name, single, why):
    with pytest.raises(storage.UnsafeName, match=why) as err:
        storage.checked_join(tmp_path, name, "index.json", single)
    assert isinstance(err.value, UserError) and "index.json" in str(err.value) and repr(name) in str(err.value)
    assert storage.checked_join("s3://b/x", "snapshots/c/f.json", "a listing") == "s3://b/x/snapshots/c/f.json"
    assert storage.checked_join(tmp_path, "f.parquet", "index.json", single=True) == tmp_path / "f.parquet"


def _plant_repo(models_uri: str, rel: str) -> None:
    snaps = storage.join(models_uri, "models--a--b", "snapshots")
    storage.write_text(storage.join(snaps, COMMIT, "config.json"), "{}")
    storage.write_bytes(f"{snaps}/{COMMIT}/{rel}", b"planted")  # written as is: no join strips the dots
    storage.write_text(storage.join(snaps, COMMIT + hub_cache.MARKER), "")


@pytest.mark.parametrize("backend", ["s3_root", "gcs_root"])
def test_a_hub_cache_key_with_dots_is_not_restored_outside_the_hub_cache(backend, request, tmp_path, monkeypatch):
    root = request.getfixturevalue(backend)
    hub = tmp_path / "a" / "b" / "c" / "hub"  # deep enough that ESCAPE lands inside tmp_path
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(hub))
    models = storage.join(root, "models")
    _plant_repo(models, ESCAPE)
    assert any(".." in k for k in storage.tree_sizes(models)), "the server normalised the planted key"
    cfg = type("Cfg", (), {"models_uri": models})()
    with pytest.raises(storage.UnsafeName, match=r"'\.\./\.\./") as err:
        hub_cache.from_bucket(cfg)
    assert "snapshots" in str(err.value)
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert not [p for p in written if not p.is_relative_to(hub)], written


def _index(prepared: str, shard: str) -> None:
    storage.write_json(storage.join(prepared, "index.json"),
                       {"shards": [{"name": shard, "split": "train", "rows": 1}], "num_codebooks": 1})


@pytest.mark.parametrize("shard", ["../x", "a/b", "/abs"])
def test_an_index_shard_name_that_leaves_the_shards_folder_is_refused(tmp_path, shard):
    from voxrelay.data.loader import PreparedDataset

    prepared = tmp_path / "prepared"
    _index(str(prepared), shard)
    with pytest.raises(storage.UnsafeName, match="index.json") as err:
        PreparedDataset.open(str(prepared), "train")
    assert repr(shard) in str(err.value)


def test_an_index_shard_name_with_dots_is_not_cached_outside_on_s3(s3_root, tmp_path, monkeypatch):
    from voxrelay.data.loader import PreparedDataset

    monkeypatch.setenv("VOXRELAY_CACHE", str(tmp_path / "a" / "b" / "cache"))
    prepared = storage.join(s3_root, "prepared")
    shard = "../../../../x"  # from <cache>/prepared/<key>/ to tmp_path/a/x
    storage.write_bytes(f"{prepared}/shards/{shard}.parquet", b"planted")
    _index(prepared, shard)
    with pytest.raises(storage.UnsafeName, match=r"index\.json names '\.\./"):
        PreparedDataset.open(prepared, "train")
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]


@pytest.mark.parametrize("name", ["../x", "a/b", "/abs"])
def test_a_sweep_experiment_name_with_a_separator_names_no_run_outside_runs(tmp_path, name):
    from voxrelay.sweep import state
    from voxrelay.sweep.spec import Experiment, Sweep

    with pytest.raises(storage.UnsafeName, match="queue") as err:
        state.run_uri(str(tmp_path), Experiment(name, {"train.lr": 0.1}))
    assert repr(name) in str(err.value)
    assert state.run_uri(str(tmp_path), Experiment("s-lr-0.1-abcdef", {})) == f"{tmp_path}/runs/s-lr-0.1-abcdef"
    # its failure record and its attempts counter, by the same name: refused, nothing written anywhere
    sweep = Sweep(str(tmp_path / "s.yaml"), "s", str(tmp_path / "base.yaml"), "d", (), (Experiment(name, {}),))
    for write in (lambda e: state.record_failure(str(tmp_path), sweep, e, 1, "why", []),
                  lambda e: state.note_start(str(tmp_path), sweep, e)):
        with pytest.raises(storage.UnsafeName, match="queue"):
            write(Experiment(name, {"train.lr": 0.1}))
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]


def test_a_wandb_run_id_with_a_separator_is_refused(tmp_path):
    from voxrelay.monitor.sinks import WANDB_RUN_FILE, wandb_run_id

    storage.write_json(storage.join(str(tmp_path), WANDB_RUN_FILE), {"id": "../../x"})
    with pytest.raises(storage.UnsafeName, match=WANDB_RUN_FILE.replace(".", r"\.")):
        wandb_run_id(str(tmp_path))


def test_a_refused_hub_cache_key_still_reaches_the_barrier(s3_root, tmp_path, monkeypatch):
    """The machine's copying process is refused after the other processes' barrier, not instead of it."""
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "a" / "b" / "c" / "hub"))
    models = storage.join(s3_root, "models")
    _plant_repo(models, ESCAPE)
    reached = []
    with pytest.raises(storage.UnsafeName):
        hub_cache.from_bucket(type("Cfg", (), {"models_uri": models})(), barrier=lambda: reached.append(1))
    assert reached == [1]
