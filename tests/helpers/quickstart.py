"""Run a quickstart page (docs/quickstart/*.md) as a user follows it, so its commands cannot go stale.

A page is walked block by block, in order: every line of a ```bash block is either run or named in the page's
``skip`` (with the reason the test cannot run it: an install, a login, several GPUs), else the test fails; a
```yaml block after ``<!-- quickstart: merge FILE -->`` is merged into FILE as the user's edit; a block after
``<!-- quickstart: write FILE -->`` is written to FILE; a ```python block after ``<!-- quickstart: run -->``
runs; a ```text block after ``<!-- quickstart: prints -->`` is what the page shows a command printing: its first
line is ``$ COMMAND`` (a command the page ran before it), each other line must be a line that command printed, the
numbers aside (``...`` stands for lines left out). A `voxrelay` command that reads a config gets the page's
``extra`` overrides appended (the tiny model, codec and sizes that make it run on a CPU); ``replace`` swaps text in a
command, a file's name or an edit (a bucket URI for a local folder)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from tests.helpers.runner import voxrelay

CONFIG_COMMANDS = ("prepare", "train", "plan", "doctor", "config", "sweep")
DIRECTIVE = re.compile(r"<!-- quickstart: (merge \S+|write \S+|run|prints) -->")
NUMBER = re.compile(r"\d[\d,.:/]*")
LOG_TIME = re.compile(r"^\[[^\]]*\] (?=(DEBUG|INFO|WARNING|ERROR|CRITICAL) )")  # a log line's time column


@dataclass
class Page:
    path: Path
    extra: list[str] = field(default_factory=list)
    skip: dict[str, str] = field(default_factory=dict)  # a command's start -> why the test does not run it
    replace: dict[str, str] = field(default_factory=dict)


@dataclass
class Ran:
    line: str
    result: subprocess.CompletedProcess
    seconds: float = 0.0


def blocks(text: str) -> list[tuple[str, str, str | None]]:
    """The fenced blocks of a page: (language, body, the directive on the line before it, if any)."""
    found, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        m = re.match(r"```(\w*)$", lines[i])
        if not m:
            i += 1
            continue
        before = DIRECTIVE.search(lines[i - 1]) if i else None
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        found.append((m.group(1), "\n".join(lines[i + 1:end]), before.group(1) if before else None))
        i = end + 1
    return found


def commands(body: str) -> list[str]:
    """A bash block's commands: continuation lines joined, comments dropped."""
    out, pending = [], ""
    for raw in body.splitlines():
        line = pending + raw.strip()
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        pending = ""
        line = re.split(r"\s+#\s", line, maxsplit=1)[0].strip()
        if line and not line.startswith("#"):
            out.append(line)
    return out


def merge(into: dict, edit: dict) -> dict:
    for key, value in edit.items():
        into[key] = merge(into.get(key) or {}, value) if isinstance(value, dict) else value
    return into


def run_page(page: Page, cwd: Path, env: dict) -> list[Ran]:
    """Follow the page in ``cwd``; every command must exit 0. Returns what each command printed."""
    env = {**env, "COLUMNS": "120"}  # a terminal's width, as the pages' example outputs have it
    ran: list[Ran] = []
    for lang, body, directive in blocks(page.path.read_text()):
        target = cwd / _replaced(page, directive.split()[1]) if directive and " " in directive else None
        if directive and directive.startswith("merge "):
            edit = yaml.safe_load(_replaced(page, body))
            target.write_text(yaml.safe_dump(merge(yaml.safe_load(target.read_text()), edit)))
        elif directive and directive.startswith("write "):
            target.write_text(_replaced(page, body) + "\n")
        elif lang == "python" and directive == "run":
            res = subprocess.run([sys.executable, "-c", body], cwd=cwd, env=env, capture_output=True, text=True,
                                 timeout=600)
            assert res.returncode == 0, f"{page.path.name}: python block\n{body}\n{res.stdout}{res.stderr}"
            ran.append(Ran(body, res))
        elif lang == "text" and directive == "prints":
            _check_printed(page, body, ran)
        elif lang == "bash":
            for line in commands(body):
                ran += _run_line(page, line, cwd, env)
    return ran


def _check_printed(page: Page, body: str, ran: list[Ran]) -> None:
    """The page's example output of a command it ran: each shown line one the command printed (numbers masked:
    the page's may come from a real run, the test's from a tiny one; stdout and stderr interleave as they came)."""
    first, *shown = body.splitlines()
    assert first.startswith("$ "), f"{page.path.name}: an output block starts with '$ COMMAND': {first!r}"
    command = _replaced(page, first[2:])
    matches = [r for r in ran if r.line == command]
    assert matches, f"{page.path.name}: {first!r} shows the output of a command the page did not run before it"
    printed = {_shape(line) for line in (matches[-1].result.stdout + matches[-1].result.stderr).splitlines()}
    missing = [line for line in shown if line.strip() != "..." and _shape(_replaced(page, line)) not in printed]
    assert not missing, f"{page.path.name}: {first!r} does not print {missing}; it printed:\n" + "\n".join(printed)


def _shape(line: str) -> str:
    """A line as compared: numbers masked, spaces collapsed, and a log line's time column dropped (the console
    prints "[time]" only when the second changed since the line before, so a run shows it or blanks)."""
    return LOG_TIME.sub("", " ".join(NUMBER.sub("#", line).split()))


def _run_line(page: Page, line: str, cwd: Path, env: dict) -> list[Ran]:
    if any(line.startswith(s) for s in page.skip):
        return []
    assert line.startswith("voxrelay "), f"{page.path.name}: {line!r} is neither run by the test nor skipped"
    line = _replaced(page, line)
    args = shlex.split(line)[1:]
    if args[0] in CONFIG_COMMANDS:
        args += page.extra
    start = time.monotonic()
    res = voxrelay(*args, env=env, cwd=cwd)
    if dump := os.environ.get("VOXRELAY_QUICKSTART_DUMP"):  # what each command printed, to write a page's examples
        with open(dump, "a") as f:
            f.write(f"$ {line}\n{res.stdout}{res.stderr}\n")
    assert res.returncode == 0, f"{page.path.name}: {line}\n{res.stdout[-3000:]}{res.stderr[-3000:]}"
    return [Ran(line, res, time.monotonic() - start)]


def _replaced(page: Page, text: str) -> str:
    for old, new in page.replace.items():
        text = text.replace(old, new)
    return text
