"""Which storage errors are transient, denied or final, and :func:`retry`: named transient errors retried with
backoff, everything else raised at once (a denied access as :class:`StorageDenied` naming the bucket)."""

from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Callable
from functools import cache
from typing import Any, TypeVar

from voxrelay.errors import UserError, one_line
from voxrelay.storage.backends import endpoint_hint, unreachable

log = logging.getLogger("voxrelay.storage.core")  # the logger these lines always had
T = TypeVar("T")


class StorageError(UserError, RuntimeError):
    """A storage operation failed for a reason retrying will not fix; the message says what to do."""


@cache
def transient_errors() -> tuple[type[BaseException], ...]:
    """The named transient error classes; imported on first use (gcsfs, botocore and aiohttp take
    ~0.5 s to import, which `--help` and `status` of a local run must not pay)."""
    errs: list[type[BaseException]] = [ConnectionError, TimeoutError]
    try:  # aiohttp is what gcsfs/s3fs speak through
        import aiohttp

        errs += [aiohttp.ClientConnectionError, aiohttp.ServerTimeoutError, aiohttp.ClientPayloadError]
    except ImportError:
        pass
    try:
        from botocore.exceptions import ConnectionClosedError, EndpointConnectionError, ReadTimeoutError

        errs += [EndpointConnectionError, ConnectionClosedError, ReadTimeoutError]
    except ImportError:
        pass
    try:
        from gcsfs.retry import HttpError

        errs.append(HttpError)  # only retried when its code is 429/5xx, see is_transient
    except ImportError:
        pass
    return tuple(errs)


class StorageDenied(StorageError):
    """The storage refused access (HTTP 401/403): the message names the bucket and what to check."""


class StorageUnavailable(StorageError):
    """The storage did not answer after every retry (network, outage): it may come back."""


def is_transient(err: BaseException, io_errors: bool = False) -> bool:
    """A named transient error (connection, timeout, HTTP 429/5xx), worth retrying. ``io_errors``:
    also any other OSError but a missing object or a denied access (a local disk that is full)."""
    if isinstance(err, StorageUnavailable):
        return True
    if denied(err):
        return False
    if io_errors and isinstance(err, OSError) and not isinstance(err, FileNotFoundError | PermissionError):
        return True
    if not isinstance(err, transient_errors()):
        return False
    code = getattr(err, "code", None)
    return not (isinstance(code, int) and code < 500 and code != 429)


def _bucket(what: str) -> str:
    uri = next((w for w in what.split() if "://" in w), what)
    scheme, _, rest = uri.partition("://")
    return f"{scheme}://{rest.split('/', 1)[0]}" if rest else uri


CREDENTIALS_FIX = (
    "check the credentials and that they may read and write it: for s3:// AWS_PROFILE or AWS_ACCESS_KEY_ID/"
    "AWS_SECRET_ACCESS_KEY (and AWS_ENDPOINT_URL for an S3-compatible server); for gs:// "
    "`gcloud auth application-default login`, GOOGLE_APPLICATION_CREDENTIALS, or on Colab "
    "google.colab.auth.authenticate_user()"
)


def denied(err: BaseException) -> bool:
    """Access refused (HTTP 401/403: revoked credentials, billing disabled, a retention lock), whatever
    exception class the SDK raises for it: never transient, retrying cannot fix it."""
    if isinstance(err, PermissionError | StorageDenied):
        return True
    code = getattr(err, "code", None)
    if isinstance(code, int) and code in (401, 403):
        return True
    # gcsfs raises a plain OSError("Forbidden: <path>\n<message>") for a 403 (gcsfs/retry.py)
    if type(err) is OSError and str(err).startswith(("Forbidden", "Unauthorized")):
        return True
    # s3fs keeps botocore's ClientError as the cause of the OSError it raises for codes it does not map
    response = getattr(err.__cause__, "response", None)
    meta = response.get("ResponseMetadata") if isinstance(response, dict) else None
    if isinstance(meta, dict) and meta.get("HTTPStatusCode") in (401, 403):
        return True
    return type(err).__name__ in ("DefaultCredentialsError", "RefreshError", "NoCredentialsError",
                                  "PartialCredentialsError")


RETRY_ATTEMPTS_ENV = "VOXRELAY_RETRY_ATTEMPTS"
RETRY_BASE_DELAY_ENV = "VOXRELAY_RETRY_BASE_DELAY"
_MAX_DELAY_S = 30.0


def _env_number(name: str, default: float, kind: type[int] | type[float], minimum: float) -> Any:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return kind(default)
    try:
        value = kind(raw)
    except ValueError:
        value = None
    if value is None or value < minimum:
        what = "a whole number" if kind is int else "a number"
        raise StorageError(f"{name}={raw!r} is invalid; set it to {what} >= {minimum} or unset it")
    return value


_ANSWERED: set[str] = set()  # buckets (scheme://name) that answered a call of this process


def retry(fn: Callable[[], T], what: str, attempts: int | None = None, base_delay: float | None = None,
          first_contact: bool = False) -> T:
    """Call ``fn``; on a named transient error wait (exponential backoff + jitter) and retry.
    An endpoint that cannot be reached at all (its host does not resolve, nothing listens) is not retried while
    its bucket has not answered once in this process (``first_contact`` forces that): a dead network or a wrong
    endpoint is raised at once as :class:`StorageUnavailable` naming the endpoint, for every command, while a
    bucket that answered before and goes away (an outage during training) is retried.

    ``attempts`` (calls in all) and ``base_delay`` (seconds before the first retry, doubled each time,
    capped at 30 s) default to $VOXRELAY_RETRY_ATTEMPTS (5) and $VOXRELAY_RETRY_BASE_DELAY (0.5).
    """
    if attempts is None:
        attempts = _env_number(RETRY_ATTEMPTS_ENV, 5, int, 1)
    if base_delay is None:
        base_delay = _env_number(RETRY_BASE_DELAY_ENV, 0.5, float, 0.0)
    bucket = _bucket(what)
    first_contact = first_contact or ("://" in bucket and bucket not in _ANSWERED)
    for attempt in range(1, attempts + 1):
        try:
            result = fn()
        except Exception as err:
            if denied(err):
                raise StorageDenied(f"access to {_bucket(what)} was denied ({what}: {type(err).__name__}: {err}); "
                                   f"{CREDENTIALS_FIX}") from None
            if first_contact and (why := unreachable(err)):
                from voxrelay.storage.core import _split  # core imports this module

                proto = _split(_bucket(what))[0]
                raise StorageUnavailable(
                    f"{_bucket(what)} cannot be reached ({what}): {why} ({one_line(err)[:200]}); check the network "
                    f"and the endpoint: {endpoint_hint(proto)}") from None
            if not is_transient(err):
                raise
            if attempt == attempts:
                raise StorageUnavailable(
                    f"{_bucket(what)} did not answer ({what}) after {attempts} attempts: {type(err).__name__}: "
                    f"{err}. Check the network and the endpoint ({RETRY_ATTEMPTS_ENV} sets the attempts)"
                ) from err
            delay = min(base_delay * 2 ** (attempt - 1), _MAX_DELAY_S) * (0.5 + random.random())
            log.warning("%s failed (%s: %s); retry %d/%d in %.1fs", what, type(err).__name__, err,
                        attempt, attempts - 1, delay)
            time.sleep(delay)
        else:
            if "://" in bucket:
                _ANSWERED.add(bucket)
            return result
    raise AssertionError("unreachable")
