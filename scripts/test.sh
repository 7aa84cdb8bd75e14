#!/usr/bin/env bash
# Set up (if needed), lint, and run every test (what CI runs). The test servers (moto S3, fake-gcs-server)
# are started by the tests themselves on 127.0.0.1.
#   bash scripts/test.sh            every test (21-25 min on 2 cores; up to twice that on a slower host)
#   bash scripts/test.sh --fast     the fast tier: -m "not slow" (a few minutes; see tests/conftest.py)
#   bash scripts/test.sh ARGS...    pytest's own arguments (a file, -k EXPR, -m EXPR), after the options above
set -euo pipefail
cd "$(dirname "$0")/.."
tier=()
if [[ "${1:-}" == "--fast" ]]; then
  tier=(-m "not slow")
  shift
fi
bash scripts/setup.sh
.venv/bin/ruff check src tests bench scripts
# two workers (VOXRELAY_TEST_WORKERS to change; 0 = in this process): most integration tests run
# single-threaded child processes, so two at a time use both cores of a 2-core machine; worksteal
# balances tests of very different lengths
.venv/bin/python -m pytest -q -n "${VOXRELAY_TEST_WORKERS:-2}" --dist worksteal "${tier[@]}" "$@"
