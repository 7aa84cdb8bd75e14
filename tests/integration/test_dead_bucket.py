"""A root whose bucket cannot be reached answers in bounded time with one clear line (issue 32 item 7).

The bound is the subprocess timeout: before the fix a `gs://` root without network took 6 min (gcsfs retried each
request 6 times under voxrelay's 5 attempts) and printed 1,061 lines of gcsfs tracebacks; an `s3://` one said
the bucket "does not exist" (s3fs' exists() swallows the connection error). Nothing here needs network: the
endpoints are a closed port on 127.0.0.1, or Google's own, which this machine cannot reach (a machine that can
is refused anonymous access: one line too)."""

from __future__ import annotations

import os

import pytest

from tests.helpers.runner import CONFIG, voxrelay
from tests.helpers.servers import apply_env, free_port, reset_storage_cache
from voxrelay import storage

pytestmark = pytest.mark.slow  # tiers: see tests/conftest.py

BOUND_S = 60  # credentials lookup + one refused/unresolved request; before the fix: minutes
SDK_ENV = ("STORAGE_EMULATOR_HOST", "GOOGLE_APPLICATION_CREDENTIALS", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3",
           "AWS_PROFILE", "VOXRELAY_RETRY_ATTEMPTS", "VOXRELAY_RETRY_BASE_DELAY", "AWS_MAX_ATTEMPTS",
           "VOXRELAY_VERBOSE")


def _prepare(root: str, env: dict[str, str], tmp_path) -> tuple[int, list[str]]:
    return _run(env, tmp_path, "prepare", CONFIG, f"root={root}")


def _run(env: dict[str, str], tmp_path, *args: str) -> tuple[int, list[str]]:
    base = {k: v for k, v in os.environ.items() if k not in SDK_ENV}
    base |= {"VOXRELAY_CACHE": str(tmp_path / "cache"), "CLOUDSDK_CONFIG": str(tmp_path / "gcloud"), **env}
    res = voxrelay(*args, env=base, timeout=BOUND_S)
    return res.returncode, [line for line in (res.stdout + res.stderr).splitlines() if line.strip()]


def _one_clear_line(lines: list[str], bucket: str, *words: str) -> None:
    assert len(lines) == 1, "\n".join(lines[:40])
    assert lines[0].startswith("error: ") and bucket in lines[0], lines[0]
    for word in words:
        assert word in lines[0], lines[0]


def test_gcs_emulator_that_cannot_be_reached(monkeypatch) -> None:
    """In-process (the terminal is the subprocess tests' business): the first contact is not retried."""
    host = f"127.0.0.1:{free_port()}"
    apply_env({"STORAGE_EMULATOR_HOST": f"http://{host}"}, monkeypatch)
    try:
        with pytest.raises(storage.StorageUnavailable) as info:
            storage.check_root("gs://dead-bucket/x")
    finally:
        reset_storage_cache()
    for words in ("gs://dead-bucket cannot be reached", "nothing accepts connections", f"STORAGE_EMULATOR_HOST=http://{host}"):
        assert words in str(info.value)


def test_gcs_root_without_credentials_or_emulator(tmp_path) -> None:
    """The reported case: Google's endpoint, no credentials. Here (no network) it cannot be reached; with a
    network anonymous access to the bucket is refused: either way one line, quickly."""
    missing = str(tmp_path / "no-such-key.json")
    code, lines = _prepare("gs://voxrelay-dead-bucket-4b1e/x", {"GOOGLE_APPLICATION_CREDENTIALS": missing}, tmp_path)
    assert code == 2
    _one_clear_line(lines, "gs://voxrelay-dead-bucket-4b1e")


def _dead_s3() -> tuple[str, dict[str, str]]:
    url = f"http://127.0.0.1:{free_port()}"
    return url, {"AWS_ENDPOINT_URL": url, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                 "AWS_DEFAULT_REGION": "us-east-1"}


# status, voices, synthesize, export and eval open a run folder alike (its config.yaml): status stands for them
@pytest.mark.parametrize("command", [("status", "RUN"), ("config", "show", "RUN/config.yaml")])
def test_every_command_on_a_bucket_that_cannot_be_reached_answers_with_one_line(tmp_path, command) -> None:
    """Not only prepare/train's root check: any command's first call to a bucket that never answered is not
    retried (a user's walk: status, synthesize, export, eval, voices took 14-58 s and 17-21 lines)."""
    url, env = _dead_s3()
    run = "s3://dead-bucket/x/runs/a"
    args = [run if a == "RUN" else str(tmp_path / "out") if a == "OUT" else a.replace("RUN", run) for a in command]
    code, lines = _run(env, tmp_path, *args)
    assert code == 2
    _one_clear_line(lines, "s3://dead-bucket", "cannot be reached", f"AWS_ENDPOINT_URL={url}")


def test_s3_root_that_cannot_be_reached(tmp_path) -> None:
    url, env = _dead_s3()
    code, lines = _prepare("s3://dead-bucket/x", env, tmp_path)
    assert code == 2
    # not "does not exist": nothing said whether it does
    _one_clear_line(lines, "s3://dead-bucket", "cannot be reached", "nothing accepts connections",
                    f"AWS_ENDPOINT_URL={url}")
