#!/usr/bin/env bash
# Set up (if needed), lint, and run every test. The test servers (moto S3, fake-gcs-server)
# are started by the tests themselves on 127.0.0.1.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check src tests bench
# two workers (VOXRELAY_TEST_WORKERS to change; 0 = in this process): most integration tests run
# single-threaded child processes, so two at a time use both cores of a 2-core machine; worksteal
# balances tests of very different lengths
.venv/bin/python -m pytest -q -n "${VOXRELAY_TEST_WORKERS:-2}" --dist worksteal "$@"
