"""The Colab cell's install and sign-in lines, run as written (the cell's own source up to its first `voxrelay`
call) with Colab's modules and the processes it starts replaced by recorders: a folder of wheels (local or gs://)
installs its newest voxrelay wheel with the gcs and eval extras, and the HF_TOKEN secret reaches the `voxrelay`
subprocess. The training part of the cell runs under nbclient in tests/integration/test_templates.py."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).parents[2] / "examples" / "colab.ipynb"
WHEELS = ["voxrelay-0.1.0-py3-none-any.whl", "voxrelay-0.2.0-py3-none-any.whl", "other-9.0-py3-none-any.whl"]


def _setup_part() -> str:
    """The cell's source up to its first `voxrelay(...)` call (sign-in, install, the runner function)."""
    (cell,) = [c for c in json.loads(NOTEBOOK.read_text())["cells"] if c["cell_type"] == "code"]
    source = "".join(cell["source"])
    return source[:source.index('if voxrelay("prepare"')]


class Recorder:
    """subprocess as the cell uses it: `run` and `Popen` record their arguments (and Popen its environment)."""

    PIPE, STDOUT = -1, -2

    def __init__(self, listing: str = "") -> None:
        self.runs: list[list[str]] = []
        self.popen_env: dict | None = None
        self.listing = listing

    def run(self, args, **_kw):
        self.runs.append(list(args))
        return types.SimpleNamespace(stdout=self.listing if args[:3] == ["gcloud", "storage", "ls"] else "",
                                     returncode=0)

    def Popen(self, args, env=None, **_kw):  # noqa: N802 (subprocess' name)
        self.popen_env = env
        return types.SimpleNamespace(stdout=iter(["ran\n"]), wait=lambda: 0, send_signal=lambda s: None)


@pytest.fixture
def colab(monkeypatch):
    """google.colab's auth (records the sign-in) and userdata (an HF_TOKEN secret)."""
    signed_in = []
    google, colab = types.ModuleType("google"), types.ModuleType("google.colab")
    colab.auth = types.SimpleNamespace(authenticate_user=lambda: signed_in.append(True))
    colab.userdata = types.SimpleNamespace(get=lambda key: "hf_secret_token" if key == "HF_TOKEN" else None)
    google.colab = colab
    for name, module in (("google", google), ("google.colab", colab)):
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setenv("HF_TOKEN", "")  # restored (removed) afterwards: the cell sets it in os.environ
    monkeypatch.delenv("HF_TOKEN")
    return signed_in


def _run_cell(monkeypatch, recorder: Recorder, pip_spec: str) -> dict:
    monkeypatch.setitem(sys.modules, "subprocess", recorder)
    monkeypatch.setenv("VOXRELAY_PIP_SPEC", pip_spec)
    namespace: dict = {}
    exec(compile(_setup_part(), str(NOTEBOOK), "exec"), namespace)
    return namespace


def test_a_local_folder_of_wheels_installs_the_newest_with_the_extras(colab, monkeypatch, tmp_path):
    for name in WHEELS:
        (tmp_path / name).write_bytes(b"")
    recorder = Recorder()
    cell = _run_cell(monkeypatch, recorder, f"{tmp_path}/")
    assert colab == [True]  # signed in to Google Cloud first
    assert recorder.runs == [[sys.executable, "-m", "pip", "install", "-q",
                              f"voxrelay[gcs,eval] @ file://{tmp_path}/voxrelay-0.2.0-py3-none-any.whl"]]
    assert cell["voxrelay"]("status", "gs://b/runs/x") == 0
    assert recorder.popen_env["HF_TOKEN"] == "hf_secret_token"  # the Colab secret reaches voxrelay


def test_a_bucket_folder_of_wheels_is_listed_copied_and_installed(colab, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    recorder = Recorder("\n".join(f"gs://b/wheels/{n}" for n in WHEELS))
    _run_cell(monkeypatch, recorder, "gs://b/wheels/")
    assert recorder.runs == [["gcloud", "storage", "ls", "gs://b/wheels/"],
                             ["gcloud", "storage", "cp", "gs://b/wheels/voxrelay-0.2.0-py3-none-any.whl", "."],
                             [sys.executable, "-m", "pip", "install", "-q",
                              f"voxrelay[gcs,eval] @ file://{tmp_path}/voxrelay-0.2.0-py3-none-any.whl"]]


def test_a_folder_without_a_wheel_stops_saying_how_to_make_one(colab, monkeypatch, tmp_path):
    with pytest.raises(SystemExit, match=r"pip wheel --no-deps \. -w dist"):
        _run_cell(monkeypatch, Recorder(), f"{tmp_path}/")
