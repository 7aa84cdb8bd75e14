"""What the CLI tells a user about a run: the voices it knows, that an early-stopped run is finished, what it
cost (`status --cost`), and `cost.budget` stopping it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.helpers.prepared import copy_corpus
from tests.helpers.runner import CONFIG, env_for, voxrelay
from tests.helpers.tiny import NO_EVALS, tiny
from voxrelay.checkpoint.stops import EXIT_TIME_LIMIT

pytestmark = pytest.mark.slow  # tiers: see tests/conftest.py


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, shared_tmp) -> tuple[str, dict]:
    """(root, env) with the tiny data prepared (the run's corpus) for the runs of this module."""
    base = copy_corpus(shared_tmp, tmp_path_factory.mktemp("reports"))
    return str(base / "root"), env_for(base / "cache")


def test_voices_early_stopping_and_cost_status(tmp_path, prepared):
    root, env = prepared
    # a learning rate that warms up far too high: the eval loss gets worse after its first evaluation
    res = voxrelay("train", CONFIG, *tiny(root, "train.max_steps=40", "train.eval_every=2", "train.lr=3",
                                          "train.warmup_steps=10", "train.clip_norm=null", "train.eval_synth=0",
                                          "train.early_stopping_patience=1", "cost.gpu_hour=2"), env=env)
    assert res.returncode == 0, res.stderr
    run = f"{root}/runs/demo"
    status = voxrelay("status", run, env=env).stdout
    assert "steps        4 of 40" in status and "finished     yes (early stopping)" in status, status
    assert "cost " not in status  # only with --cost

    cost = voxrelay("status", run, "--cost", env=env)
    assert cost.returncode == 0, cost.stderr
    (session,) = json.loads((Path(run) / "usage.json").read_text())["sessions"]
    assert session["step"] == 4 and session["processes"] == 1 and session["class_a"] > 0 < session["bytes_written"]
    # "  <item, 11 wide> <so far> <to finish>  <how>"
    items = {line[2:13].strip(): line[13:].split() for line in cost.stdout.splitlines() if line.startswith("  ")}
    assert list(items) == ["gpu", "operations", "egress", "replication", "soft delete", "stored", "total"]
    gpu_usd = session["seconds"] / 3600 * 2  # one process x $2/h
    assert float(items["gpu"][0]) == pytest.approx(gpu_usd, abs=1e-4) and items["gpu"][1] == "0"  # finished
    assert f"{session['class_a']} class A x $0.05/10k + {session['class_b']} class B x $0.004/10k" in cost.stdout
    ops = session["class_a"] * 0.05 / 1e4 + session["class_b"] * 0.004 / 1e4
    assert float(items["operations"][0]) == pytest.approx(ops, rel=1e-2)
    assert float(items["total"][0]) == pytest.approx(sum(float(items[k][0]) for k in items if k != "total"), abs=2e-4)
    assert "budget" not in cost.stdout and "advice" not in cost.stdout  # the GPU is most of this bill
    assert "a local disk bills neither: cost.class_a_per_10k=0" in " ".join(cost.stdout.split())  # root: a folder

    voices = voxrelay("voices", run, env=env)
    assert voices.returncode == 0 and voices.stdout.split() == ["en-gb+f3", "en-us"]
    assert voxrelay("export", run, "-o", str(tmp_path / "exp"), env=env).returncode == 0
    assert voxrelay("voices", str(tmp_path / "exp"), env=env).stdout.split() == ["en-gb+f3", "en-us"]
    bad = voxrelay("voices", str(tmp_path), env=env)
    assert bad.returncode == 2 and "neither a run folder" in bad.stderr and "Traceback" not in bad.stderr


def test_budget_stops_at_a_committed_checkpoint_until_it_is_raised(prepared):
    root, env = prepared
    # each class A request (a write, a listing) costs $1 and nothing else is priced: the spend counts requests,
    # the same on a slow host as on a fast one (the lease is not renewed within the test)
    priced = ("name=budget", NO_EVALS, "checkpoint.lease_seconds=600", "cost.gpu_hour=0",
              "cost.class_a_per_10k=10000", "cost.class_b_per_10k=0")
    run = Path(root) / "runs/budget"

    def sessions() -> list[dict]:
        return json.loads((run / "usage.json").read_text())["sessions"]

    first = voxrelay("train", CONFIG, *tiny(root, *priced, "train.max_steps=40", "cost.budget=40"), env=env)
    out = " ".join(first.stderr.split())
    assert first.returncode == EXIT_TIME_LIMIT, first.stderr
    stopped = int(re.search(r"stopped at step (\d+) \(cost.budget\); checkpoint committed", out).group(1))
    assert 2 <= stopped < 40
    assert "raise cost.budget (e.g. cost.budget=80) to train on" in out
    manifest = json.loads(max(run.glob("checkpoints/step-*/manifest.json")).read_text())
    assert (manifest["step"], manifest["stopped"]) == (stopped, "cost.budget")
    (s1,) = sessions()
    assert (s1["stopped"], s1["budget"], s1["step"]) == ("cost.budget", 40.0, stopped) and s1["class_a"] >= 40
    status = voxrelay("status", str(run), "--cost", env=env).stdout
    assert "finished     no (the last session stopped: cost.budget)" in status, status
    assert f"budget       $40: training has spent ${s1['class_a']:.2f} of it" in status, status

    # the same budget: refused before anything is built, nothing written
    again = voxrelay("train", CONFIG, *tiny(root, *priced, "train.max_steps=40", "cost.budget=40"), env=env)
    assert again.returncode == 2, again.stderr
    assert "raise cost.budget (e.g. cost.budget=80) to train on" in " ".join(again.stderr.split())
    assert "Traceback" not in again.stderr and sessions() == [s1]
    assert max(run.glob("checkpoints/step-*/manifest.json")).parent.name == f"step-{stopped:08d}"

    # raised: two more steps (one save) in a session of its own, counted on its own
    raised = voxrelay("train", CONFIG, *tiny(root, *priced, f"train.max_steps={stopped + 2}", "cost.budget=1000"),
                      env=env)
    assert raised.returncode == 0, raised.stderr
    s1_again, s2 = sessions()
    assert s1_again == s1 and s2["step"] == stopped + 2 and "stopped" not in s2
    assert 0 < s2["class_a"] < s1["class_a"]  # its own requests: the first session's are not in it again
    status = voxrelay("status", str(run), "--cost", env=env).stdout
    assert f"{s1['class_a'] + s2['class_a']} class A x $10000/10k" in status and "finished     yes" in status

    # trained to the end: a further train says so (not "resuming"), trains nothing, exits 0
    done = voxrelay("train", CONFIG, *tiny(root, *priced, f"train.max_steps={stopped + 2}", "cost.budget=1000"),
                    env=env)
    said = " ".join(done.stderr.split())
    assert done.returncode == 0 and "resuming" not in said, done.stderr
    assert f"is already trained to step {stopped + 2} (train.max_steps {stopped + 2}): nothing to train" in said
    assert max(run.glob("checkpoints/step-*/manifest.json")).parent.name == f"step-{stopped + 2:08d}"
