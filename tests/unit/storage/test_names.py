"""A name read from a user's file resolves under its dataset's root, in a bucket as on a disk, or is refused."""

from __future__ import annotations

import os

import pytest

from voxrelay import storage

ROOT = "s3://bucket/raw"


@pytest.mark.parametrize("name, where", [
    ("wavs/a.wav", "s3://bucket/raw/wavs/a.wav"),
    ("./wavs/../wavs/a.wav", "s3://bucket/raw/wavs/a.wav"),
    ("s3://bucket/raw/wavs/a.wav", "s3://bucket/raw/wavs/a.wav"),  # a full URI inside the root
])
def test_a_name_inside_a_bucket_root_resolves(name, where):
    assert storage.inside(ROOT, name) == where
    assert storage.inside(ROOT + "/", name) == where


@pytest.mark.parametrize("name, reason", [
    ("../secret.wav", "outside the dataset folder"),
    ("wavs/../../raw2/a.wav", "outside the dataset folder"),
    ("/etc/passwd", "is absolute but the dataset is in a bucket"),
    ("s3://other-bucket/raw/a.wav", "outside the dataset folder"),
    ("s3://bucket/raw-other/a.wav", "outside the dataset folder"),  # a prefix of the name is not a folder
    ("gs://bucket/raw/a.wav", "outside the dataset folder"),
])
def test_a_name_leaving_a_bucket_root_is_refused(name, reason):
    with pytest.raises(storage.OutsideRoot, match=reason):
        storage.inside(ROOT, name)


def test_a_local_root_resolves_symlinks_and_refuses_bucket_names(tmp_path):
    (tmp_path / "data").mkdir()
    os.symlink("/etc/passwd", tmp_path / "data" / "link.wav")
    assert storage.inside(str(tmp_path / "data"), "a.wav") == str((tmp_path / "data" / "a.wav").resolve())
    for name in ("link.wav", "../x.wav", "/etc/passwd", "s3://bucket/a.wav"):
        with pytest.raises(storage.OutsideRoot, match="outside the dataset folder"):
            storage.inside(str(tmp_path / "data"), name)
    assert storage.parent("s3://bucket/raw/train.jsonl") == "s3://bucket/raw"
    assert storage.basename("s3://bucket/raw/train.jsonl") == "train.jsonl"
