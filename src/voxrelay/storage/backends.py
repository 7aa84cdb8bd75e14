"""The fsspec filesystems voxrelay talks to, made so that a dead endpoint answers in bounded time.

voxrelay retries named transient errors itself (:func:`voxrelay.storage.retrying.retry`: 5 attempts, about 8 s of
backoff). gcsfs retries every request 6 times over about 31 s whatever failed (a host that does not resolve
too) and has no timeouts; under voxrelay's retries that multiplied to 6 minutes for a ``gs://`` root without
network, and each of its give-ups logged a traceback. So, for GCS:

* one gcsfs retry of a request is kept (its refresh of a token that expired in flight, HTTP 401), not five;
* connecting times out after :data:`CONNECT_TIMEOUT_S`, a silent read after :data:`READ_TIMEOUT_S` (a long
  upload is not bounded as a whole), and so does the extended class's gRPC query of a bucket's type;
* credentials are Application Default Credentials when there are some, else anonymous (public buckets): not
  gcsfs' further probes of the metadata server, 15 s more on a machine that has none.

s3fs already bounds its connects (5 s) and botocore retries a refused connection for about 10 s.

The SDKs' own log records (gcsfs logs a traceback at ERROR for every request it gives up on) are left out of
the terminal unless ``--verbose`` (VOXRELAY_VERBOSE=1): voxrelay says what failed in its own words.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
from typing import Any

import fsspec

CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 120.0
GCS_TRIES = 2  # gcsfs' attempts of one request: the first and its token-refresh retry
SDK_LOGGERS = ("gcsfs", "s3fs", "aiobotocore", "botocore", "google.auth", "google_auth_httplib2", "fsspec", "urllib3")
_NO_HOST = {socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)}


class _QuietUnlessVerbose(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return os.environ.get("VOXRELAY_VERBOSE", "") not in ("", "0")


_QUIET = _QuietUnlessVerbose()


def quiet_sdk_logs() -> None:
    """The storage SDKs' log records reach the terminal only with --verbose (idempotent)."""
    for name in SDK_LOGGERS:
        logger = logging.getLogger(name)
        if _QUIET not in logger.filters:
            logger.addFilter(_QUIET)


def open_filesystem(proto: str) -> fsspec.AbstractFileSystem:
    """The filesystem of fsspec protocol ``proto`` (``gcs``, ``s3``, ``file``, ``memory``); ImportError when
    its package is missing."""
    quiet_sdk_logs()
    if proto == "s3":
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        kw: dict[str, Any] = {"client_kwargs": {"endpoint_url": endpoint}} if endpoint else {}
        return fsspec.filesystem("s3", **kw)
    if proto == "gcs":
        return _gcs()
    return fsspec.filesystem(proto)


def _gcs() -> fsspec.AbstractFileSystem:
    import aiohttp
    from gcsfs.core import GCSFileSystem

    timeout = aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_S, sock_read=READ_TIMEOUT_S)
    emulator = os.environ.get("STORAGE_EMULATOR_HOST")
    if emulator:
        # The plain class, not fsspec's "gcs": gcsfs chooses that one when it is first imported from
        # GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT, default on, and the extended class probes each bucket over gRPC,
        # a 60 s timeout per bucket on an emulator.
        return _bounded(GCSFileSystem)(endpoint_url=emulator, token="anon", project="voxrelay",
                                       requests_timeout=timeout)
    cls = fsspec.get_filesystem_class("gcs")
    # gcsfs' extended class (zonal and hierarchical buckets) first asks the Storage Control API over gRPC what
    # kind of bucket it is, retrying for 60 s: bounded like a connect (on failure it goes on as the plain class)
    extended = {} if cls is GCSFileSystem else {"retry_timeout": CONNECT_TIMEOUT_S}
    return _bounded(cls)(requests_timeout=timeout, **extended, **_gcs_credentials())


def _bounded(cls: type) -> type:
    """``cls`` (gcsfs' class or its extended one) whose requests gcsfs tries :data:`GCS_TRIES` times: its
    decorated methods re-decorated, in a class placed right above GCSFileSystem (the extended class's own
    overrides call them through super())."""
    from gcsfs.core import GCSFileSystem
    from gcsfs.retry import retry_request

    def bound(name: str) -> Any:
        return retry_request(retries=GCS_TRIES)(getattr(GCSFileSystem, name).__wrapped__)

    names = ("_request", "_get_file_request", "_get_file_concurrent")
    bounded = type("BoundedGCSFileSystem", (GCSFileSystem,), {name: bound(name) for name in names})
    return bounded if cls is GCSFileSystem else type(f"Bounded{cls.__name__}", (cls, bounded), {})


def _gcs_credentials() -> dict[str, Any]:
    """gcsfs arguments for Application Default Credentials (GOOGLE_APPLICATION_CREDENTIALS, gcloud's
    application-default login, Colab's authenticate_user(), a GCE/GKE service account), or anonymous access."""
    import google.auth
    from google.auth.exceptions import DefaultCredentialsError

    try:
        credentials, project = google.auth.default(scopes=["https://www.googleapis.com/auth/devstorage.full_control"])
    except DefaultCredentialsError:
        return {"token": "anon"}  # a private bucket then answers 401, which names the credentials to set
    return {"token": credentials, "project": project}


def unreachable(err: BaseException) -> str | None:
    """Why the endpoint behind ``err`` cannot be reached at all (its host name does not resolve, nothing listens
    on its port), as a few words; None for any other failure. Looks through the chain of causes: aiohttp's,
    botocore's and urllib3's wrappers."""
    seen: set[int] = set()
    stack: list[Any] = [err]
    while stack:
        e = stack.pop()
        if not isinstance(e, BaseException) or id(e) in seen:
            continue
        seen.add(id(e))
        if type(e).__name__ == "ClientConnectorDNSError" or (isinstance(e, OSError) and e.errno in _NO_HOST):
            return "its host name does not resolve"
        if isinstance(e, ConnectionRefusedError) or (isinstance(e, OSError) and e.errno == errno.ECONNREFUSED):
            return "nothing accepts connections on its port"
        kwargs = getattr(e, "kwargs", None)  # botocore keeps the underlying error in .kwargs["error"]
        stack += [e.__cause__, e.__context__, getattr(e, "os_error", None),
                  kwargs.get("error") if isinstance(kwargs, dict) else None]
    return None


def endpoint_hint(proto: str) -> str:
    """Where requests of ``proto`` go, and which variable sets it."""
    if proto == "gcs":
        emulator = os.environ.get("STORAGE_EMULATOR_HOST")
        return f"STORAGE_EMULATOR_HOST={emulator}" if emulator else \
            "storage.googleapis.com (STORAGE_EMULATOR_HOST unset)"
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if endpoint:
        name = "AWS_ENDPOINT_URL_S3" if os.environ.get("AWS_ENDPOINT_URL_S3") else "AWS_ENDPOINT_URL"
        return f"{name}={endpoint}"
    return "AWS's S3 endpoint (AWS_ENDPOINT_URL unset)"
