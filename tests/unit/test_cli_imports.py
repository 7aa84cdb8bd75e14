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
    ["eval", "--help"], ["import", "--help"], ["config", "show", str(demo_config_path())],
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
