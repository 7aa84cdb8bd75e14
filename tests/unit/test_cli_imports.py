"""The commands people run dozens of times a day (`--help`, `config show`, `status`) answer at once:
they must not import torch or the other heavy libraries (torch alone takes seconds on a slow host)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from voxrelay.cli import demo_config_path

HEAVY = ("torch", "transformers", "accelerate", "gcsfs", "s3fs", "botocore", "pyarrow", "datasets", "snac")
PROBE = """
import json, runpy, sys
sys.argv = ["voxrelay", *sys.argv[1:]]
code = 0
try:
    runpy.run_module("voxrelay", run_name="__main__")
except SystemExit as e:
    code = e.code or 0
print(json.dumps({"code": code, "heavy": sorted(m for m in HEAVY if m in sys.modules)}), file=sys.stderr)
""".replace("HEAVY", repr(HEAVY))


def _imports(*args: str) -> dict:
    res = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=120)
    return json.loads(res.stderr.strip().splitlines()[-1])


@pytest.mark.parametrize("args", [
    ["--help"], ["config", "--help"], ["prepare", "--help"], ["train", "--help"], ["status", "--help"],
    ["synthesize", "--help"], ["export", "--help"], ["voices", "--help"], ["demo", "--help"], ["plan", "--help"],
    ["eval", "--help"], ["import", "--help"], ["doctor", "--help"], ["sweep", "--help"],
    ["config", "show", str(demo_config_path())],
])
def test_help_and_config_show_import_nothing_heavy(args):
    got = _imports(*args)
    assert got == {"code": 0, "heavy": []}


def test_status_of_a_local_run_imports_nothing_heavy(tmp_path):
    run = tmp_path / "runs" / "x"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text("train: {max_steps: 5}\n")
    (run / "metrics.jsonl").write_text(json.dumps({"step": 3, "loss": 1.0, "time": 1.0}) + "\n")
    got = _imports("status", str(run))
    assert got == {"code": 0, "heavy": []}


def test_the_sweep_worker_and_its_status_import_nothing_heavy(tmp_path):
    """A sweep worker waits for hours beside its trainers (and runs on a notebook's kernel): torch stays in them."""
    sweep = tmp_path / "lr.yaml"
    sweep.write_text(f"base: {demo_config_path()}\ngrid: {{train.lr: [1.0e-4, 5.0e-5]}}\n")
    got = _imports("sweep", "status", str(sweep), f"root={tmp_path}")
    assert got == {"code": 0, "heavy": []}
    from voxrelay.sweep import worker

    probe = subprocess.run([sys.executable, "-c", f"import sys, {worker.__name__}; print(sorted(m for m in "
                            f"{HEAVY!r} if m in sys.modules))"], capture_output=True, text=True, timeout=120)
    assert probe.stdout.strip() == "[]", probe.stderr
