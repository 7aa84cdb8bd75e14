"""The launch templates in examples/: the Colab notebook's cell run as Colab would run it (nbclient, a plain
ipykernel), session after session against a GCS server on 127.0.0.1; the SkyPilot task files checked by SkyPilot's
own task schema (tests/helpers/skypilot.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from tests.helpers.tiny import NO_EVALS, NO_SAVES, tiny
from voxrelay import storage
from voxrelay.cli import demo_config_path
from voxrelay.config import load_config

pytestmark = pytest.mark.slow  # tiers: see tests/conftest.py

EXAMPLES = Path(__file__).parents[2] / "examples"
NOTEBOOK = EXAMPLES / "colab.ipynb"
# no evals, no periodic saves: a session saves once, when it stops
QUICK = (NO_EVALS, NO_SAVES, "monitor.tensorboard=false")


def _run_notebook(tmp_path: Path, session: str, env: dict[str, str]) -> str:
    """Execute the notebook's cells in a new kernel whose environment has ``env`` too; their printed output."""
    nbclient = pytest.importorskip("nbclient")
    nbformat = pytest.importorskip("nbformat")
    import os

    nb = nbformat.read(NOTEBOOK, as_version=4)
    cwd = tmp_path / session
    cwd.mkdir()
    client = nbclient.NotebookClient(nb, kernel_name="python3", timeout=240, resources={"metadata": {"path": str(cwd)}})
    client.execute(env=dict(os.environ, **env))  # (passed to the kernel's Popen)
    return "".join(out.get("text", "") for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs)


def test_colab_notebook_is_one_cell_that_trains_and_resumes_in_the_next_session(tmp_path, gcs_root):
    nb = yaml.safe_load(NOTEBOOK.read_text())  # (JSON is YAML)
    assert [c["cell_type"] for c in nb["cells"]].count("code") == 1
    config = storage.join(gcs_root, "configs", "tiny.yaml")
    storage.write_text(config, load_config(demo_config_path(), tiny(gcs_root, "name=colab", *QUICK)).to_yaml())
    # what the test changes: the config's URI; no pip install (this venv's voxrelay); the session clock from the
    # process start (this machine booted long ago); the deadline: a `train.total_time_limit` of 1 s of training
    # ends the first session with exit 77 after some steps, whatever the host's speed (a per-session
    # `time_limit` would have to guess the start-up time); a new $VOXRELAY_CACHE per session: a new runtime
    env = {"VOXRELAY_CONFIG": config, "VOXRELAY_PIP_SPEC": "", "OMP_NUM_THREADS": "1"}
    first = _run_notebook(tmp_path, "one", env | {
        "VOXRELAY_CACHE": str(tmp_path / "cache-1"),
        "VOXRELAY_OVERRIDES": "train.time_limit_from=process train.max_steps=100000 train.total_time_limit=1s"})
    assert "re-run this cell in a new session to resume" in first, first
    stopped = int(re.search(r"trained to step (\d+)", first).group(1))
    assert stopped >= 1, first

    second = _run_notebook(tmp_path, "two", env | {
        "VOXRELAY_CACHE": str(tmp_path / "cache-2"),
        "VOXRELAY_OVERRIDES": f"train.time_limit_from=process train.max_steps={stopped + 3}"})
    assert "shards written 0" in second, second  # prepare found the first session's data
    assert f"resuming {storage.join(gcs_root, 'runs', 'colab')} from step {stopped}" in second, second
    assert f"trained to step {stopped + 3}" in second and "voxrelay: finished, nothing left to train" in second, second


SKYPILOT_TASKS = sorted(EXAMPLES.glob("skypilot*.yaml"))


@pytest.mark.parametrize("path", SKYPILOT_TASKS, ids=lambda p: p.name)
def test_skypilot_task_passes_skypilots_schema(path):
    from tests.helpers.skypilot import task_errors

    task = yaml.safe_load(path.read_text())
    assert task_errors(task) == []
    resources = task["resources"]
    assert resources["use_spot"] is True and "file_mounts" not in task  # voxrelay talks to the bucket itself
    assert {75, 76} <= set(resources["job_recovery"]["recover_on_exit_codes"])  # voxrelay's "run it again" codes
    assert 77 not in resources["job_recovery"]["recover_on_exit_codes"]  # a spent total_time_limit: never again
    # (issue 33 W2) a permanent failure (storage refused, saves failing) is final: never recovered, nor restarted
    assert 74 not in resources["job_recovery"]["recover_on_exit_codes"]
    assert resources["job_recovery"].get("max_restarts_on_errors", 0) == 0
    assert "voxrelay " in task["run"]


@pytest.mark.parametrize("change, error", [
    (lambda t: t["resources"].update(use_spott=True), "'use_spott' was unexpected"),
    (lambda t: t["resources"]["job_recovery"].update(recover_on_exit_codes=[75, 760]), "760 is greater than"),
    (lambda t: t["resources"]["job_recovery"].update(strategy="EAGER"), "job_recovery.strategy 'EAGER'"),
    (lambda t: t.update(env=t.pop("envs")), "'env' was unexpected"),
    (lambda t: t["envs"].update({"BAD-NAME": "x"}), "envs: 'BAD-NAME' does not match"),
], ids=["typo", "exit-code-range", "unknown-strategy", "env-not-envs", "env-name"])
def test_skypilot_schema_check_finds_mistakes(change, error):
    from tests.helpers.skypilot import task_errors

    task = yaml.safe_load(SKYPILOT_TASKS[0].read_text())
    change(task)
    assert any(error in e for e in task_errors(task)), task_errors(task)


def test_skypilot_itself_accepts_the_tasks():
    """With VOXRELAY_SKYPILOT_PYTHON, a Python that has skypilot (scripts/skypilot_schema.py says how to make
    one): its ``sky.Task.from_yaml`` loads every task file, and the exported schemas are its own."""
    import json
    import os
    import subprocess

    from tests.helpers.skypilot import exported

    python = os.environ.get("VOXRELAY_SKYPILOT_PYTHON")
    if not python:
        pytest.skip("VOXRELAY_SKYPILOT_PYTHON is not set (a Python with skypilot; see scripts/skypilot_schema.py)")
    code = ("import json, sys, sky\nfrom sky.utils import schemas\n"
            "for p in sys.argv[1:]: sky.Task.from_yaml(p)\n"
            "print(json.dumps([sky.__version__, schemas.get_task_schema(), schemas.get_resources_schema()]))")
    res = subprocess.run([python, "-c", code, *map(str, SKYPILOT_TASKS)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    version, task, resources = json.loads(res.stdout.strip().splitlines()[-1])
    assert [task, resources] == [exported()["task"], exported()["resources"]], (
        f"SkyPilot {version}'s schemas differ from the exported {exported()['skypilot']}'s: "
        f"run {python} scripts/skypilot_schema.py")
