"""bench/gpu_suite.sh (what a lent card runs) at tiny sizes on a CPU: every part runs; bench/packing.py's packed and
padded arms train the same batches to the same losses over optimizer steps, and it ends on its ratio; the Unsloth
arm says why it is skipped without CUDA, and the suite's summary reads both tables. One run of the suite serves
every check (each part is a fresh interpreter: ~10 s of imports)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow]


def test_the_gpu_suite_runs_every_part_at_tiny_sizes_on_a_cpu(tmp_path: Path) -> None:
    """`GPU_SUITE_SMOKE=1 bash bench/gpu_suite.sh` (what a lent card runs, shrunk): every part starts offline with
    the card's settings (PYTHONPATH=src, the hub offline), ends within its limit and prints its ratio line; the
    summary names the Trainer ratio and says the Unsloth part is skipped without it."""
    import os

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"GPU_SUITE_SMOKE": "1"}
    res = subprocess.run(["bash", "bench/gpu_suite.sh", str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                         timeout=900, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    summary = (tmp_path / "summary.txt").read_text()
    parts = {m.group(1): (int(m.group(2)), m.group(3)) for m in
             re.finditer(r"^(\S+)\s+rc (\d+)\s+\d+s\s+(.*)$", summary, re.M)}
    assert list(parts) == ["orpheus3b_pack", "parler_mini", "fused_loss", "plan_accuracy", "ckpt_stall",
                           "orpheus3b_compile"], summary
    assert all(rc == 0 for rc, _ in parts.values()), summary
    assert all(re.fullmatch(r"ratio (\d+\.\d+|nan)( \(.+\))?", last) for _, last in parts.values()), summary
    assert parts["plan_accuracy"][1] == "ratio nan"  # its rows are the CUDA ones: none on a CPU
    assert parts["orpheus3b_compile"][1] == "ratio nan (no arm pair to compare)"  # --arms packed, not compiled
    assert "unsloth          skipped" in summary and "voxrelay packed / HF Trainer tokens/s: " in summary
    _check_the_packing_bench(tmp_path / "orpheus3b_pack.log", tmp_path / "ratios")


def _check_the_packing_bench(log: Path, scratch: Path) -> None:
    """bench/packing.py's output (the suite's first part): the padding packing removed, packed and padded losses
    equal over AdamW steps on the same batches, the Trainer arm trained, its ratio last; then the suite's ratio
    script on it with an Unsloth row."""
    out = log.read_text()
    lines = out.splitlines()
    arms = {m.group(1): float(m.group(2)) for m in (re.match(r"^(bucketed|shuffled|packed)\s+([\d.]+)%", x)
                                                     for x in lines) if m}
    assert arms["packed"] == 0.0 and arms["shuffled"] > 5.0, out  # the padding packing removed
    diff = float(re.search(r"largest relative difference per step ([\d.e+-]+)", out).group(1))
    assert diff <= 1e-5, out  # the AdamW steps on the same batches, packed vs padded
    assert re.search(r"^hf_trainer\s+nan%\s+[\d.]+", out, re.M), out  # the Trainer arm trained
    assert re.fullmatch(r"ratio \d+\.\d+", lines[-1]), lines[-1]
    scratch.mkdir()
    (scratch / "orpheus3b_pack.log").write_text(out)
    unsloth = subprocess.run([sys.executable, "bench/unsloth_arm.py"], cwd=ROOT, capture_output=True, text=True)
    assert unsloth.returncode == 2 and "needs CUDA and `pip install unsloth`" in unsloth.stdout  # skipped here
    (scratch / "unsloth.log").write_text(unsloth.stdout + "unsloth               12.0     2000.0   nan%      nan\n")
    ratios = subprocess.run([sys.executable, "bench/suite_ratios.py", str(scratch)], cwd=ROOT, capture_output=True,
                            text=True).stdout
    packed = float(re.search(r"^packed\s+\S+\s+\S+\s+(\S+)", out, re.M).group(1))
    assert f"voxrelay packed / Unsloth tokens/s: {packed / 2000:.3f} (goal >= 1.0)" in ratios, ratios
    assert re.search(r"voxrelay packed / HF Trainer tokens/s: \d+\.\d{3} \(goal >= 1.5\)", ratios), ratios
