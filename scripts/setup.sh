#!/usr/bin/env bash
# One-time set-up of a fresh machine: a virtualenv in .venv with voxrelay and its test tools.
# Re-running is cheap: it reinstalls only when pyproject.toml or constraints.txt changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
stamp=.venv/.voxrelay-installed
want=$(cat pyproject.toml constraints.txt | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then exit 0; fi
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# torch first and pinned (constraints.txt): an unpinned torch would pull GBs of CUDA packages.
.venv/bin/python -m pip install -q -c constraints.txt torch
.venv/bin/python -m pip install -q -c constraints.txt -e ".[dev]"
echo "$want" > "$stamp"
