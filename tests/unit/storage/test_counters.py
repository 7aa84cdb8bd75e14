"""voxrelay.storage counts the requests it makes, by billing class, and the bytes it moves, on a local root and
on real S3 (moto) and GCS (fake-gcs-server) servers: what `status --cost` prices."""

from __future__ import annotations

from pathlib import Path

import pytest

from voxrelay import storage


@pytest.fixture
def root(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return str(tmp_path / "root") if request.param == "local" else request.getfixturevalue(f"{request.param}_root")


def _delta(before: dict[str, int]) -> dict[str, int]:
    now = storage.op_counts()
    return {k: now[k] - before[k] for k in now if now[k] != before[k]}


@pytest.mark.parametrize("root", ["local", "s3", "gcs"], indirect=True)
def test_requests_are_counted_by_class_with_their_bytes(root: str, tmp_path: Path) -> None:
    uri = storage.join(root, "run/a.bin")
    before = storage.op_counts()
    storage.write_bytes(uri, b"x" * 10)
    assert _delta(before) == {"class_a": 1, "bytes_written": 10}  # an insert / PUT

    before = storage.op_counts()
    assert storage.read_bytes(uri) == b"x" * 10
    assert storage.exists(uri) and storage.size(uri) == 10
    assert _delta(before) == {"class_b": 3, "bytes_read": 10}  # a GET, two metadata reads

    local = tmp_path / "big.bin"
    local.write_bytes(b"y" * 1000)
    before = storage.op_counts()
    storage.put_file(local, storage.join(root, "run/ckpt/model.bin"))
    storage.get_file(storage.join(root, "run/ckpt/model.bin"), tmp_path / "back.bin")
    assert _delta(before) == {"class_a": 1, "class_b": 1, "bytes_written": 1000, "bytes_read": 1000}

    before = storage.op_counts()
    assert storage.listdir(storage.join(root, "run")) == ["a.bin", "ckpt"]
    assert storage.file_sizes(storage.join(root, "run/ckpt")) == {"model.bin": 1000}
    assert _delta(before) == {"class_a": 2}  # listings are class A

    before = storage.op_counts()
    version = storage.create_new(storage.join(root, "run/lease.json"), b"{}")
    storage.replace_if(storage.join(root, "run/lease.json"), b'{"n": 1}', version)
    assert storage.read_versioned(storage.join(root, "run/lease.json")).data == b'{"n": 1}'
    assert _delta(before) == {"class_a": 2, "class_b": 1, "bytes_written": 10, "bytes_read": 8}

    before = storage.op_counts()
    storage.delete(uri)  # free
    storage.delete(storage.join(root, "run/ckpt"), recursive=True)  # its listing
    assert _delta(before) == {"class_a": 1}
    assert not storage.exists(storage.join(root, "run/ckpt/model.bin"))
