"""GPU utilisation and memory for the throughput reports, when there is a GPU: memory from torch, utilisation
from NVML through ``nvidia-ml-py`` (``pip install 'voxrelay[gpu]'``) when it is installed. Never raises: a
report is no reason to stop training."""

from __future__ import annotations

import logging

import torch

log = logging.getLogger(__name__)
_nvml: object | None = None  # the pynvml module once initialised; False when it cannot be


def gpu_stats() -> dict[str, float]:
    """``gpu_mem_gb`` (peak allocated by torch since the last report, this process's device) and, with NVML,
    ``gpu_util`` (the device's busy share over the driver's last sample period, 0-1); {} without a GPU."""
    if not torch.cuda.is_available():
        return {}
    out = {"gpu_mem_gb": torch.cuda.max_memory_allocated() / 1e9}
    torch.cuda.reset_peak_memory_stats()
    nvml = _load_nvml()
    if nvml:
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
            out["gpu_util"] = nvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0
        except Exception as err:  # noqa: BLE001 - a report, never a reason to stop
            log.debug("NVML: %s", err)
    return out


def _load_nvml():
    global _nvml
    if _nvml is None:
        try:
            import pynvml

            pynvml.nvmlInit()
            _nvml = pynvml
        except Exception:  # noqa: BLE001 - not installed, or no driver: utilisation is left out
            _nvml = False
    return _nvml
