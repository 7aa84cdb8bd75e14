"""Conditional writes (what a run's lease is built on) on a local folder, memory://, S3 (moto) and GCS
(fake-gcs-server): create only if absent, replace only if unchanged; of writers racing from several
processes exactly one wins each round."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from voxrelay import storage

BACKENDS = ["local", "memory", "s3", "gcs"]


@pytest.fixture
def root(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    kind = request.param
    if kind == "local":
        return str(tmp_path / "root")
    return request.getfixturevalue(f"{kind}_root")


def on(*kinds: str):
    return pytest.mark.parametrize("root", kinds, indirect=True)


@on(*BACKENDS)
def test_create_only_if_absent_then_replace_only_if_unchanged(root: str) -> None:
    uri = storage.join(root, "run/lease.json")
    assert storage.read_versioned(uri) is None
    v1 = storage.create_new(uri, b"first")
    with pytest.raises(FileExistsError):
        storage.create_new(uri, b"second")
    got = storage.read_versioned(uri)
    assert got == storage.Versioned(b"first", v1)
    v2 = storage.replace_if(uri, b"third", v1)
    assert v2 != v1 and storage.read_versioned(uri) == storage.Versioned(b"third", v2)
    with pytest.raises(storage.PreconditionFailed):  # based on a version that is gone
        storage.replace_if(uri, b"fourth", v1)
    assert storage.read_bytes(uri) == b"third"
    storage.delete(uri)
    with pytest.raises(storage.PreconditionFailed):  # nothing to replace
        storage.replace_if(uri, b"fifth", v2)
    assert not storage.exists(uri)


RACER = """
import sys
from voxrelay import storage
uri, me, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
wins = []
for i in range(rounds):
    key = f"{uri}-{i}"
    try:
        version = storage.create_new(key, me.encode())
    except FileExistsError:
        got = storage.read_versioned(key)
        try:
            storage.replace_if(key, me.encode() + b"+", got.version)
        except storage.PreconditionFailed:
            continue
        wins.append(f"{i}:replace")
        continue
    wins.append(f"{i}:create")
print(" ".join(wins))
"""


@on("local", "s3", "gcs")
def test_racing_processes_each_round_one_creator(root: str) -> None:
    """Three processes create the same objects at once: each object has exactly one creator; the others
    replace it at most once each, each replace based on a version they read (never a lost update)."""
    rounds, uri = 8, storage.join(root, "race/obj")
    procs = [subprocess.Popen([sys.executable, "-c", RACER, uri, f"p{n}", str(rounds)], stdout=subprocess.PIPE,
                              text=True, env=os.environ.copy()) for n in range(3)]
    outs = [p.communicate(timeout=120)[0].split() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    for i in range(rounds):
        creators = [n for n, out in enumerate(outs) if f"{i}:create" in out]
        replacers = [n for n, out in enumerate(outs) if f"{i}:replace" in out]
        assert len(creators) == 1, (i, outs)
        final = storage.read_bytes(f"{uri}-{i}").decode()
        # the object holds the last successful writer's bytes: the creator's, or a replacer's that read it
        expected = {f"p{creators[0]}"} if not replacers else {f"p{n}+" for n in replacers}
        assert final in expected, (i, final, outs)


@on("local", "s3", "gcs")
def test_the_lease_probe_passes_a_store_that_refuses_a_second_create_and_leaves_nothing(root: str) -> None:
    """Issue 33 D5: `train` and `doctor` probe the root once; the probe object is deleted."""
    assert storage.ignores_conditional_create(root) is None
    assert not [p for p in storage.file_sizes(root) if ".voxrelay-lease-probe-" in p]


@on("local", "s3")
def test_the_lease_probe_names_a_store_that_ignores_the_condition(root: str) -> None:
    """A store that ignores If-None-Match answers a conditional create as a plain put: the probe says so."""
    found = storage.ignores_conditional_create(root, create=storage.write_bytes)
    assert found is not None and "ignores the condition" in found and root in found
