"""What ``voxrelay doctor`` measures on this machine: mounts (``/proc/mounts``), free disk, where the Hugging
Face cache points, the GPU, and the root's throughput (a probe object written, read back and deleted)."""

from __future__ import annotations

import os
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from voxrelay import storage

PROBE_PREFIX = ".voxrelay-doctor-probe-"
MB = 10**6


def disk_free(path: str | Path) -> tuple[int, int]:
    """(free, total) bytes of the disk that holds ``path`` (or its nearest existing parent)."""
    p = Path(path).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    usage = shutil.disk_usage(p)
    return usage.free, usage.total


def hf_cache(env: dict[str, str] | None = None) -> tuple[Path, str]:
    """Where huggingface_hub keeps downloaded models, and the variable that says so (its own rules:
    ``HF_HUB_CACHE``, else ``HF_HOME``/hub, else ``$XDG_CACHE_HOME``/huggingface/hub, else ~/.cache/...)."""
    env = os.environ if env is None else env
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"]).expanduser(), "HF_HUB_CACHE"
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]).expanduser() / "hub", "HF_HOME"
    base = Path(env["XDG_CACHE_HOME"]) if env.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    return base / "huggingface" / "hub", "the default"


@dataclass(frozen=True)
class Gpu:
    """The machine's GPUs as torch sees them: ``name`` and ``memory`` (bytes) of the first, ``count``."""

    name: str
    memory: int
    count: int


def has_nvidia_device() -> bool:
    """An NVIDIA driver with a device (no torch import: a CPU machine answers at once)."""
    return Path("/dev/nvidia0").exists() or any(Path("/proc/driver/nvidia/gpus").glob("*"))


def gpu_info() -> Gpu | None:
    """The CUDA GPUs torch can use, or None (no device, or a torch without CUDA)."""
    if not has_nvidia_device():
        return None
    import torch

    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(0)
    return Gpu(props.name, int(props.total_memory), torch.cuda.device_count())


@dataclass(frozen=True)
class Probe:
    """A throughput probe: ``size`` bytes written and read back, in ``write_s`` / ``read_s`` seconds."""

    uri: str
    size: int
    write_s: float
    read_s: float

    @property
    def write_mbps(self) -> float:
        return self.size / MB / max(self.write_s, 1e-9)

    @property
    def read_mbps(self) -> float:
        return self.size / MB / max(self.read_s, 1e-9)


def probe_uri(root: str) -> str:
    return storage.join(root, f"{PROBE_PREFIX}{uuid.uuid4().hex[:12]}")


def _drop_page_cache(uri: str) -> None:
    """A local probe is read from the disk, not from the page cache it was just written through."""
    if storage.is_local(uri) and hasattr(os, "posix_fadvise"):
        fd = os.open(storage.local_path(uri), os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        except OSError:
            pass  # a filesystem that does not take the hint (FUSE): its own cache answers
        finally:
            os.close(fd)


def probe(root: str, size: int) -> Probe:
    """Write ``size`` random bytes to a new object under ``root``, read it back, compare, delete it (always,
    whatever failed). Raises :class:`~voxrelay.storage.StorageError` when the root cannot be written or read."""
    uri = probe_uri(root)
    data = os.urandom(size)  # incompressible: a FUSE mount or a proxy cannot shrink it
    try:
        t0 = time.perf_counter()
        storage.write_bytes(uri, data)
        t1 = time.perf_counter()
        _drop_page_cache(uri)
        t2 = time.perf_counter()
        back = storage.read_bytes(uri)
        t3 = time.perf_counter()
    finally:
        storage.delete(uri)
    if back != data:
        raise storage.StorageError(f"the probe object {uri} read back differs from what was written "
                                   f"({len(back)} of {size} bytes); check the storage endpoint or mount")
    return Probe(uri, size, t1 - t0, t3 - t2)
