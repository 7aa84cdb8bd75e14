#!/usr/bin/env bash
# Set up (if needed), lint, and run every test. The test servers (moto S3, fake-gcs-server)
# are started by the tests themselves on 127.0.0.1.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check src tests bench
.venv/bin/python -m pytest -q "$@"
