"""The machine checks of ``voxrelay doctor``: mounts (a recorded /proc/mounts), throughput, local disk, the
Hugging Face cache, the GPU vs the plan; each passing and failing, on values; the probe on a real folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.metadata import FIXTURES
from voxrelay import storage
from voxrelay.doctor import FAIL, OK, SKIP, WARN
from voxrelay.doctor.facts import PROBE_PREFIX, Gpu, Probe, hf_cache, probe
from voxrelay.doctor.host_checks import (
    disk_check,
    gpu_check,
    hf_cache_check,
    mounted_root_check,
    throughput_check,
)
from voxrelay.storage.mounts import Mount, gcsfuse_uri, mount_kind, mount_of, parse_mounts

GB = 10**9
COLAB = parse_mounts((FIXTURES / "proc_mounts_colab.txt").read_text())
A100 = Gpu("NVIDIA A100-SXM4-40GB", int(42.4 * GB), 1)


def test_recorded_mounts_are_parsed_and_paths_find_their_mount():
    assert Mount("tts-colab-data", "/content/gcs", "fuse.gcsfuse") in COLAB
    assert mount_of("/content/gcs/runs/x", COLAB).fstype == "fuse.gcsfuse"
    assert mount_of("/content/drive/MyDrive/tts", COLAB).point == "/content/drive"
    assert mount_of("/content/data", COLAB).point == "/"  # the longest mount point above it
    assert mount_of("/content/gcsx", COLAB).point == "/"  # a prefix of the name is not a parent
    assert [mount_kind(mount_of(p, COLAB)) for p in ("/content/gcs/a", "/content/drive/a", "/tmp")] == \
        ["gcsfuse", "Google Drive", None]


def test_octal_escapes_in_mount_points():
    (m,) = parse_mounts("bucket /mnt/my\\040data fuse.gcsfuse rw 0 0\n")
    assert m.point == "/mnt/my data"


def test_mounted_root_plain_disk_passes_gcsfuse_and_drive_warn():
    assert mounted_root_check("/tmp/vr", mount_of("/tmp/vr", COLAB)).verdict == OK
    assert mounted_root_check("gs://b/run", None).verdict == OK
    fuse = mounted_root_check("/content/gcs/voxrelay", mount_of("/content/gcs/voxrelay", COLAB))
    assert fuse.verdict == WARN and "not atomic" in fuse.found
    assert fuse.fix.startswith("set root=gs://tts-colab-data/voxrelay ")
    drive = mounted_root_check("/content/drive/MyDrive/tts", mount_of("/content/drive/MyDrive/tts", COLAB))
    assert drive.verdict == WARN and "Drive syncs later" in drive.found and "gs://" in drive.fix
    assert gcsfuse_uri("/content/gcs", mount_of("/content/gcs", COLAB)) == "gs://tts-colab-data"
    assert gcsfuse_uri("/content/drive/x", mount_of("/content/drive/x", COLAB)) is None


def test_throughput_fast_passes_slow_warns_error_fails():
    fast = throughput_check(Probe("u", 32 * 10**6, 0.2, 0.1), checkpoint_bytes=8 * GB)
    assert fast.verdict == OK and "write 160 MB/s, read 320 MB/s" in fast.found and "~50 s" in fast.found
    slow_read = throughput_check(Probe("u", 32 * 10**6, 0.2, 1.0))
    assert slow_read.verdict == WARN and "read under 50 MB/s" in slow_read.found
    slow_write = throughput_check(Probe("u", 32 * 10**6, 4.0, 0.1))
    assert slow_write.verdict == WARN and "write under 20 MB/s" in slow_write.found
    assert throughput_check(None, error="access denied").verdict == FAIL
    assert throughput_check(None).verdict == SKIP


def test_local_disk_roomy_passes_tight_warns_full_fails():
    assert disk_check("/c", 100 * GB, 5.0, 20.0, 8 * GB, 3).verdict == OK
    tight = disk_check("/c", 30 * GB, 5.0, 20.0, 8 * GB, 3)  # 5 + 20 + 3 x 8 = 49 GB wanted
    assert tight.verdict == WARN and "3 staged checkpoints of 8.0 GB" in tight.found
    assert disk_check("/c", 4 * GB, 5.0, 20.0).verdict == FAIL
    no_room_for_a_checkpoint = disk_check("/c", 10 * GB, 5.0, 20.0, 8 * GB, 3)
    assert no_room_for_a_checkpoint.verdict == FAIL and "one 8.0 GB checkpoint" in no_room_for_a_checkpoint.found
    on_drive = disk_check("/content/drive/cache", 900 * GB, 5.0, 20.0, mount=mount_of("/content/drive/c", COLAB))
    assert on_drive.verdict == WARN and "VOXRELAY_CACHE" in on_drive.fix


def test_hf_cache_local_passes_fuse_and_small_disk_warn():
    assert hf_cache_check(Path("/c/hf-hub"), "HF_HUB_CACHE", 100 * GB, None).verdict == OK
    fuse = hf_cache_check(Path("/content/drive/hf"), "HF_HOME", 900 * GB, mount_of("/content/drive/hf", COLAB))
    assert fuse.verdict == WARN and "unset HF_HOME" in fuse.fix
    small = hf_cache_check(Path("/root/.cache/huggingface/hub"), "the default", 8 * GB,
                           mount_of("/root/.cache", COLAB))
    assert small.verdict == WARN and "(on /)" in small.found


def test_hf_cache_location_follows_huggingface_hub_rules(tmp_path):
    assert hf_cache({"HF_HUB_CACHE": "/a", "HF_HOME": "/b"}) == (Path("/a"), "HF_HUB_CACHE")
    assert hf_cache({"HF_HOME": "/b"}) == (Path("/b/hub"), "HF_HOME")
    assert hf_cache({"XDG_CACHE_HOME": "/x"}) == (Path("/x/huggingface/hub"), "the default")
    assert hf_cache({})[0] == Path.home() / ".cache" / "huggingface" / "hub"


def test_gpu_fits_passes_does_not_fit_fails():
    fits = gpu_check(A100, "ddpx1 full adamw", int(30 * GB))
    assert fits.verdict == OK and "30.0 GB per GPU for ddpx1 full adamw" in fits.found
    tight = gpu_check(A100, "ddpx1 full adamw", int(40 * GB), "try train.gradient_checkpointing=true")
    assert tight.verdict == WARN and tight.fix == "try train.gradient_checkpointing=true"
    too_big = gpu_check(A100, "ddpx1 full adamw", int(61 * GB), "try train.lora=true")
    assert too_big.verdict == FAIL and too_big.fix == "try train.lora=true" and "does not fit" in too_big.found
    assert gpu_check(None).verdict == SKIP
    assert gpu_check(A100, error="no prepared data").verdict == SKIP


def test_probe_measures_and_leaves_nothing_behind(tmp_path):
    root = str(tmp_path / "root")
    result = probe(root, 2 * 10**6)
    assert result.size == 2 * 10**6 and result.write_s > 0 and result.read_s > 0
    assert result.uri.startswith(f"{root}/{PROBE_PREFIX}")
    assert [p for p in Path(root).rglob("*") if p.is_file()] == []


def test_probe_that_cannot_write_raises_and_leaves_nothing(tmp_path):
    (tmp_path / "file").write_text("a file where the root's folder should be")
    with pytest.raises((storage.StorageError, OSError)):
        probe(str(tmp_path / "file" / "root"), 10**6)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_probe_on_memory_root_deletes_its_object():
    root = "memory://doctor-probe-test"
    probe(root, 10**5)
    assert storage.listdir(root) == []


def test_the_lease_row_fails_a_fuse_root_unless_one_machine_trains_it():
    """What `train` refuses, doctor fails first: a Drive or gcsfuse root without checkpoint.single_machine."""
    from voxrelay.doctor.host_checks import lease_check

    gcs = mount_of("/content/gcs/voxrelay", COLAB)
    refused = lease_check("/content/gcs/voxrelay", None, mount=gcs)
    assert refused.verdict == FAIL and "gcsfuse mount" in refused.found and "another machine" in refused.found
    assert "root=gs://tts-colab-data/voxrelay" in refused.fix and "checkpoint.single_machine=true" in refused.fix
    stated = lease_check("/content/gcs/voxrelay", None, mount=gcs, single_machine=True)
    assert stated.verdict == WARN and "single_machine" in stated.found
    assert lease_check("/tmp/vr", None).verdict == OK
    assert lease_check("/content/gcs/voxrelay", "it ignores", mount=gcs, single_machine=True).verdict == FAIL
