"""Shared fixtures. Object-storage tests run against real servers on 127.0.0.1 (tests/helpers/servers.py).

Tiers: a module whose tests run whole trainings, several processes or seconds each sets ``pytestmark =
pytest.mark.slow`` (and ``distributed`` when it starts torch.distributed jobs); a test that uses the S3/GCS servers
is marked ``servers`` here. ``bash scripts/test.sh --fast`` runs ``-m "not slow"`` (minutes, for the edit-test
loop); ``bash scripts/test.sh`` runs everything (what CI runs)."""

from __future__ import annotations

import os

# One OpenMP thread per process, the workers' own in-process models included (the commands they start already run
# with OMP_NUM_THREADS=1): two workers on two cores each with a second thread spin against each other (measured:
# four in-process test files 136-145 s with torch's default of 2 threads, 50-53 s with 1). Set before torch loads.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# A command that dies of a signal (SIGSEGV, SIGABRT) prints the Python stack of each of its threads to its stderr.
os.environ.setdefault("PYTHONFAULTHANDLER", "1")

import re  # noqa: E402
import uuid
from collections.abc import Iterator  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from tests.helpers.servers import GCSServer, S3Server, ServerUnavailable, apply_env, reset_storage_cache  # noqa: E402


def _server(cls: type[S3Server] | type[GCSServer]) -> Iterator[S3Server | GCSServer]:
    try:
        cls.check_available()
    except ServerUnavailable as err:  # only a missing package skips; a server that fails to start fails
        pytest.skip(str(err))
    with cls() as server:
        yield server


SERVER_FIXTURES = {"s3_server", "gcs_server", "s3_root", "gcs_root"}


def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        named = set(getattr(item, "fixturenames", ())) | {v for v in params.values() if isinstance(v, str)}
        if SERVER_FIXTURES & named:  # a fixture, or a parameter naming one (request.getfixturevalue)
            item.add_marker(pytest.mark.servers)


@pytest.fixture(scope="module", autouse=True)
def _global_state() -> Iterator[None]:
    """Each test module leaves the process as it found it (torn down after the module's own fixtures, which may
    hold an Accelerator or a group for all its tests): accelerate's singletons (an Accelerator built with bf16
    makes every later one in the worker bf16) and a torch.distributed group it created (FSDP's world of one)."""
    import sys

    yield
    if "accelerate" in sys.modules:
        from accelerate.state import AcceleratorState, GradientState, PartialState

        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()
        PartialState._reset_state()
    if "torch.distributed" in sys.modules:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


@pytest.fixture(scope="session")
def shared_tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder every pytest-xdist worker of this run shares (the run's own base folder when not distributed)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if re.fullmatch(r"popen-gw\d+", base.name) else base


@pytest.fixture
def tiny_prepared(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shared_tmp: Path):
    """``make(*overrides)`` -> the tiny config at ``tmp_path/root`` with its data prepared, from the corpus prepared
    once per run (tests/helpers/prepared.py); VOXRELAY_CACHE is ``tmp_path/cache``."""
    from tests.helpers.prepared import prepared_config

    return lambda *overrides, **kw: prepared_config(tmp_path, monkeypatch, shared_tmp, *overrides, **kw)


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """moto S3 server for the whole session: ``.endpoint``, ``.bucket``, ``.env()``, ``.stop()``, ``.start()``."""
    yield from _server(S3Server)  # type: ignore[misc]


@pytest.fixture(scope="session")
def gcs_server() -> Iterator[GCSServer]:
    """fake-gcs-server for the whole session, same interface as ``s3_server``."""
    yield from _server(GCSServer)  # type: ignore[misc]


def _unique(request: pytest.FixtureRequest) -> str:
    return f"{re.sub(r'[^A-Za-z0-9_-]+', '-', request.node.name).strip('-')[:60]}-{uuid.uuid4().hex[:8]}"


def _root(server: S3Server | GCSServer, scheme: str, request, monkeypatch) -> Iterator[str]:
    if not server.running:  # an earlier test stopped it and failed before restarting it
        server.start()
    apply_env(server.env(), monkeypatch)
    yield f"{scheme}://{server.bucket}/{_unique(request)}"
    reset_storage_cache()  # monkeypatch restores the environment after this


@pytest.fixture
def s3_root(s3_server: S3Server, request, monkeypatch) -> Iterator[str]:
    """A fresh ``s3://<bucket>/<test-name>-<uuid>`` with the environment pointing voxrelay at ``s3_server``."""
    yield from _root(s3_server, "s3", request, monkeypatch)


@pytest.fixture
def gcs_root(gcs_server: GCSServer, request, monkeypatch) -> Iterator[str]:
    """A fresh ``gs://<bucket>/<test-name>-<uuid>`` with the environment pointing voxrelay at ``gcs_server``."""
    yield from _root(gcs_server, "gs", request, monkeypatch)


@pytest.fixture
def memory_root() -> Iterator[str]:
    """A fresh ``memory://<uuid>`` (fsspec's in-process store), deleted afterwards."""
    from voxrelay import storage

    root = f"memory://{uuid.uuid4().hex}"
    yield root
    storage.delete(root, recursive=True)
