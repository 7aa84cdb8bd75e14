"""Run several ``voxrelay`` command lines in one process, each exactly as ``python -m voxrelay ARGS`` runs it
(``voxrelay.cli.main`` with that ``sys.argv``), and print each one's exit code, stdout and stderr as JSON: a test
of many quick refusals pays the interpreter's and torch's start-up once instead of once per command.

Input on stdin: ``{"name": [args...], ...}``; output: ``{"name": {"returncode", "stdout", "stderr"}, ...}``. An
exception that escapes ``main`` (a bug: the CLI shows it whole) is printed as its traceback, exit code 1.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import traceback


def run(args: list[str]) -> dict:
    from voxrelay.cli import main

    out, err = io.StringIO(), io.StringIO()
    code = 0
    argv, sys.argv = sys.argv, ["voxrelay", *args]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main()
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            except BaseException:  # noqa: BLE001 (reported as the CLI would show it)
                traceback.print_exc()
                code = 1
    finally:
        sys.argv = argv
    return {"returncode": code, "stdout": out.getvalue(), "stderr": err.getvalue()}


if __name__ == "__main__":
    commands = json.load(sys.stdin)
    results = {name: run(args) for name, args in commands.items()}
    sys.__stdout__.write(json.dumps(results))
