"""Prepared data is identified by its content and parameters, never by when it was written:
re-running an unchanged `prepare` (every Colab session does) changes no file and training resumes;
changed parameters are never mixed silently into a committed dataset."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.runner import CONFIG, env_for, voxrelay
from tests.helpers.tiny import tiny

pytestmark = pytest.mark.slow  # tiers: see tests/conftest.py


def _snapshot(folder: Path) -> dict[str, tuple[int, bytes]]:
    return {str(p.relative_to(folder)): (p.stat().st_mtime_ns, p.read_bytes())
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A prepared tiny corpus and a run trained 4 steps on it (checkpoints at 2 and 4)."""
    base = tmp_path_factory.mktemp("identity")
    env = env_for(base / "cache")
    root = str(base / "root")
    for args in (("prepare", CONFIG, *tiny(root)), ("train", CONFIG, *tiny(root, "train.max_steps=4"))):
        res = voxrelay(*args, env=env)
        assert res.returncode == 0, res.stdout + res.stderr
    return base, root, env


def test_unchanged_prepare_changes_no_file_and_train_resumes(trained):
    base, root, env = trained
    prepared = base / "root" / "prepared" / "demo"
    before = _snapshot(prepared)
    res = voxrelay("prepare", CONFIG, *tiny(root), env=env)
    assert res.returncode == 0, res.stderr
    assert "shards written 0" in res.stdout
    assert _snapshot(prepared) == before  # same bytes AND same modification times: nothing rewritten
    index = json.loads((prepared / "index.json").read_text())
    assert index["identity"]["params"]["codec.hop_length"] == 256
    marker = json.loads(next((prepared / "shards").glob("train-*.done")).read_text())
    assert marker["params"] == index["identity"]["params"]  # every shard records what made it
    record = json.loads((prepared / "codec.json").read_text())
    assert record["params"]["codec.hop_length"] == 256 and record["state_sha256"] == index["identity"]["codec_sha256"]

    res = voxrelay("train", CONFIG, *tiny(root, "train.max_steps=5"), env=env)
    assert res.returncode == 0, res.stderr
    assert "resuming" in res.stderr and "from step 4" in res.stderr


@pytest.mark.parametrize("change", ["codec.hop_length=200", "data.min_duration=0.7"])
def test_changed_parameters_stop_prepare_and_change_nothing(trained, change):
    base, root, env = trained
    prepared = base / "root" / "prepared" / "demo"
    before = _snapshot(prepared)
    res = voxrelay("prepare", CONFIG, *tiny(root, change), env=env)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "Traceback" not in res.stderr
    key = change.split("=")[0]
    assert key in res.stderr and "data.name=demo-2" in res.stderr and "--overwrite" in res.stderr
    assert _snapshot(prepared) == before


def test_overwrite_reencodes_and_train_names_what_changed(tmp_path):
    env = env_for(tmp_path / "cache")
    root = str(tmp_path / "root")
    for args in (("prepare", CONFIG, *tiny(root)), ("train", CONFIG, *tiny(root, "train.max_steps=2"))):
        assert voxrelay(*args, env=env).returncode == 0
    res = voxrelay("prepare", CONFIG, *tiny(root, "codec.hop_length=200"), "--overwrite", env=env)
    assert res.returncode == 0, res.stderr
    assert "shards written 0" not in res.stdout
    index = json.loads((tmp_path / "root/prepared/demo/index.json").read_text())
    assert index["codec"]["hop_length"] == 200 and index["identity"]["params"]["codec.hop_length"] == 200
    for marker in (tmp_path / "root/prepared/demo/shards").glob("*.done"):  # no shard of the old codec is left
        assert json.loads(marker.read_text())["params"]["codec.hop_length"] == 200

    # the run's config is unchanged, but the data it was trained on is not: the error names the change
    res = voxrelay("train", CONFIG, *tiny(root, "train.max_steps=4"), env=env)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    msg = " ".join(res.stderr.split())
    assert "changed since step 2" in msg and "codec.hop_length 256 -> 200" in msg
    assert "incompatible changes" not in msg  # the config itself did not change
    # --fresh is the last way out named, and it says what it deletes
    assert msg.index("re-run `voxrelay prepare`") < msg.index("name=demo-2") < msg.index("--fresh")
    assert "deletes this run's 1 checkpoint(s)" in msg
