"""A resume costs no more memory than a fresh start: the checkpoint's weights go from the file into the
model tensor by tensor (no second copy held beside the model), and the peak RSS of a resumed process
through its first steps stays within 5% of a fresh one's.

Each measurement is its own process (this file run as a script): it resets its peak RSS (VmHWM, via
/proc/self/clear_refs) right before ``build_run``, reads the peak and the current RSS after it, trains two
steps and reads the peak again (on a GPU machine also ``torch.cuda.max_memory_allocated``). The model is
big enough (~150 MB of weights) for a copy to show.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.runner import CONFIG, env_for, voxrelay
from tests.helpers.tiny import NO_EVALS, NO_SAVES, tiny

pytestmark = pytest.mark.slow  # tiers: see tests/conftest.py

BIG = ("model.hidden_size=768", "model.num_layers=4", "model.num_heads=8", "model.intermediate_size=3072",
       NO_EVALS, NO_SAVES, "train.batch_tokens=600")


def _measure(base: Path, name: str) -> dict:
    paths = [str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH")]  # tests.* importable
    env = env_for(base / "cache", {"PYTHONPATH": os.pathsep.join(p for p in paths if p)})
    res = subprocess.run([sys.executable, __file__, str(base / "root"), name], env=env, capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc to reset the peak RSS")
def test_resume_reads_the_checkpoint_into_the_model_and_peaks_like_a_fresh_start(tmp_path):
    root = str(tmp_path / "root")
    env = env_for(tmp_path / "cache")
    assert voxrelay("prepare", CONFIG, *tiny(root), env=env).returncode == 0
    res = voxrelay("train", CONFIG, *tiny(root, "name=resumed", "train.max_steps=2", *BIG), env=env)
    assert res.returncode == 0, res.stderr
    weights_mb = (tmp_path / "root/runs/resumed/checkpoints/step-00000002/model.safetensors").stat().st_size / 2**20
    fresh, resumed = _measure(tmp_path, "fresh"), _measure(tmp_path, "resumed")
    assert resumed["resumed_from"] == 2 and fresh["resumed_from"] is None
    # loading held no copy of the weights: the peak while building is the memory the built run keeps
    transient = resumed["peak_build"] - resumed["rss_after_build"]
    assert transient < 0.1 * weights_mb, (transient, weights_mb, resumed)
    assert resumed["peak_steps"] <= 1.05 * fresh["peak_steps"], (resumed, fresh)
    if fresh["gpu_peak"] is not None:  # on a GPU machine: the device's own peak, too
        assert resumed["gpu_peak"] <= 1.05 * fresh["gpu_peak"], (resumed, fresh)
    print(f"resume memory: weights {weights_mb:.0f} MB, transient at build {transient:.0f} MB, peak through two "
          f"steps {resumed['peak_steps']:.0f} MB vs fresh {fresh['peak_steps']:.0f} MB")


def _status_mb(key: str) -> float:
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith(key + ":"))
    return int(line.split()[1]) / 1024


def main(root: str, name: str) -> None:
    """Build the run ``name`` (resuming if it has a checkpoint), train two steps, print the memory as JSON."""
    import torch

    from voxrelay.config import load_config
    from voxrelay.train.build import build_run
    from voxrelay.train.loop import train_step

    torch.set_num_threads(1)
    cfg = load_config(CONFIG, tiny(root, f"name={name}", "train.max_steps=4", *BIG))
    Path("/proc/self/clear_refs").write_text("5")  # the peak RSS restarts from now
    run = build_run(cfg)
    peak_build, after_build = _status_mb("VmHWM"), _status_mb("VmRSS")
    batches = iter(run.stream)
    for _ in range(2):
        train_step(run, [next(batches)])
    gpu_peak = torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else None
    print(json.dumps({"resumed_from": run.resumed_from, "peak_build": peak_build, "rss_after_build": after_build,
                      "peak_steps": _status_mb("VmHWM"), "gpu_peak": gpu_peak}))
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
