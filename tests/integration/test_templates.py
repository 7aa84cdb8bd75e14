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
SWEEP_NOTEBOOK = EXAMPLES / "colab-sweep.ipynb"
# no evals, no periodic saves: a session saves once, when it stops
QUICK = (NO_EVALS, NO_SAVES, "monitor.tensorboard=false")


def _run_notebook(tmp_path: Path, session: str, env: dict[str, str], notebook: Path = NOTEBOOK) -> str:
    """Execute the notebook's cells in a new kernel whose environment has ``env`` too; their printed output, and
    ``[audio]`` / ``[image]`` for each audio player and image the cells displayed."""
    nbclient = pytest.importorskip("nbclient")
    nbformat = pytest.importorskip("nbformat")
    import os

    nb = nbformat.read(notebook, as_version=4)
    cwd = tmp_path / session
    cwd.mkdir()
    client = nbclient.NotebookClient(nb, kernel_name="python3", timeout=240, resources={"metadata": {"path": str(cwd)}})
    client.execute(env=dict(os.environ, **env))  # (passed to the kernel's Popen)
    shown = [out for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs]
    return "".join(out.get("text", "") or ("[image]" if "image/png" in out.get("data", {}) else "[audio]"
                                           if "<audio" in out.get("data", {}).get("text/html", "") else "")
                   for out in shown)


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
    # every session ends showing its work: status, a sample to play, the eval's curves
    assert "durable      step" in first and first.count("[audio]") == 1 and first.count("[image]") == 1, first
    stopped = int(re.search(r"trained to step (\d+)", first).group(1))
    assert stopped >= 1, first

    second = _run_notebook(tmp_path, "two", env | {
        "VOXRELAY_CACHE": str(tmp_path / "cache-2"),
        "VOXRELAY_OVERRIDES": f"train.time_limit_from=process train.max_steps={stopped + 3}"})
    assert "shards written 0" in second, second  # prepare found the first session's data
    assert f"resuming {storage.join(gcs_root, 'runs', 'colab')} from step {stopped}" in second, second
    assert f"trained to step {stopped + 3}" in second and "voxrelay: finished, nothing left to train" in second, second
    assert second.count("[audio]") == second.count("[image]") == 1 and "results in gs://" in second, second


def test_the_sweep_notebook_runs_the_same_cell_over_a_sweep_and_shows_each_experiment(tmp_path, gcs_root):
    nb, sweep_nb = (yaml.safe_load(p.read_text()) for p in (NOTEBOOK, SWEEP_NOTEBOOK))
    (cell,) = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert sweep_nb["cells"][-1]["source"] == cell["source"]  # one cell to keep right, not two drifting apart
    base = storage.join(gcs_root, "sweeps", "base.yaml")
    storage.write_text(base, load_config(demo_config_path(), tiny(gcs_root, *QUICK)).to_yaml())
    sweep = storage.join(gcs_root, "sweeps", "lr.yaml")
    storage.write_text(sweep, "base: base.yaml\ngrid:\n  train.lr: [1.0e-3, 5.0e-4]\n")
    shown = _run_notebook(tmp_path, "sweep", {
        "VOXRELAY_SWEEP": sweep, "VOXRELAY_CONFIG": base, "VOXRELAY_PIP_SPEC": "", "OMP_NUM_THREADS": "1",
        "VOXRELAY_CACHE": str(tmp_path / "cache"), "VOXRELAY_OVERRIDES": "train.time_limit_from=process"},
        SWEEP_NOTEBOOK)
    assert "voxrelay: finished, nothing left to train" in shown, shown
    assert shown.count("finished") >= 3 and "lr-lr-0.001" in shown and shown.count("[image]") == 1, shown
    assert shown.count("[audio]") == 1 and "a sample of gs://" in shown, shown  # (trained without evals)


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


@pytest.mark.parametrize("path", SKYPILOT_TASKS, ids=lambda p: p.name)
def test_skypilot_setup_installs_the_newest_wheel_of_a_folder(path, tmp_path):
    """The install line as written: VOXRELAY_PIP_SPEC a folder of wheels (here a local one; gs:// and s3:// list
    and copy the same way) installs its newest voxrelay wheel with the extras; no wheel there: exit 2, saying how
    to make one. `pip` and `uv` are stubs that record their arguments."""
    import os
    import subprocess

    stubs, wheels, home = tmp_path / "bin", tmp_path / "wheels", tmp_path / "home"
    for folder in (stubs, wheels, home):
        folder.mkdir()
    for tool in ("pip", "uv"):
        (stubs / tool).write_text(f'#!/bin/sh\necho "{tool} $*" >> {tmp_path}/calls\n')
        (stubs / tool).chmod(0o755)
    for name in ("voxrelay-0.1.0-py3-none-any.whl", "voxrelay-0.2.0-py3-none-any.whl", "other-9.0-py3-none-any.whl"):
        (wheels / name).write_bytes(b"")
    setup = yaml.safe_load(path.read_text())["setup"]
    env = dict(os.environ, PATH=f"{stubs}:{os.environ['PATH']}", HOME=str(home))
    res = subprocess.run(["bash", "-c", setup], env=env | {"VOXRELAY_PIP_SPEC": f"{wheels}/"}, capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    installed = (tmp_path / "calls").read_text().splitlines()[-1]
    assert installed == (f"uv pip install --python {home}/voxrelay-env/bin/python "
                         f"voxrelay[gcs,s3,eval] @ file://{home}/voxrelay-0.2.0-py3-none-any.whl")
    empty = subprocess.run(["bash", "-c", setup], env=env | {"VOXRELAY_PIP_SPEC": f"{home}/none/"},
                           capture_output=True, text=True, timeout=60)
    assert empty.returncode == 2 and "pip wheel --no-deps . -w dist" in empty.stdout


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
