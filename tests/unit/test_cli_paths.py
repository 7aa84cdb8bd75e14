"""Every path a command is given is checked before the command does anything (before a model loads): one it
cannot read or write is exit 2 with one line naming the option, the path and the errno's meaning, never a
traceback. The parameters are enumerated from the typer app itself, so a new path option cannot be
forgotten: it is tested here once it is listed in ROLES (or, if it is not a path, in NOT_PATHS).

In-process (``voxrelay.cli.main``): each case is a parse of the command line, milliseconds. Tests run as
root here, where ``chmod`` makes nothing unwritable: the unwritable places are a pseudo filesystem (/proc,
/sys) and a path under a regular file; a read-only mount and a full disk are in
tests/integration/test_full_disk.py (they need a mount namespace)."""

from __future__ import annotations

import errno
import inspect
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, get_type_hints

import pytest
import typer

from voxrelay import cli

READ_FILE, READ_FOLDER, WRITE_FILE, WRITE_FOLDER = ("read", "file"), ("read", "folder"), ("write", "file"), (
    "write", "folder")


def _as_is(path: str) -> list[str]:
    return [path]


def _voice(path: str) -> list[str]:  # a voice prompt of a family that clones voices: SPEAKER=clip.wav
    return [f"0={path}"]


# (command, parameter) -> (what the command does with it, how a path is written as its value)
ROLES: dict[tuple[str, str], tuple[tuple[str, str], Callable[[str], list[str]]]] = {
    ("config show", "config"): (READ_FILE, _as_is),
    ("prepare", "config"): (READ_FILE, _as_is),
    ("train", "config"): (READ_FILE, _as_is),
    ("plan", "config"): (READ_FILE, _as_is),
    ("doctor", "config"): (READ_FILE, _as_is),
    ("status", "run"): (READ_FOLDER, _as_is),
    ("synthesize", "run"): (READ_FOLDER, _as_is),
    ("synthesize", "output"): (WRITE_FILE, _as_is),
    ("synthesize", "voice"): (READ_FILE, _voice),
    ("synthesize", "script"): (READ_FILE, _as_is),
    ("eval", "run"): (READ_FOLDER, _as_is),
    ("eval", "texts"): (READ_FILE, _as_is),
    ("voices", "run"): (READ_FOLDER, _as_is),
    ("export", "run"): (READ_FOLDER, _as_is),
    ("export", "output"): (WRITE_FOLDER, _as_is),
    ("import", "file"): (READ_FILE, _as_is),
    ("import", "output"): (WRITE_FILE, _as_is),
    ("import", "prepared"): (READ_FOLDER, _as_is),
    ("demo", "root"): (WRITE_FOLDER, _as_is),
    ("sweep", "args"): (READ_FILE, _as_is),  # SWEEP.yaml, then overrides
    ("init", "output"): (WRITE_FILE, _as_is),
}
# text parameters that are not paths, and why
NOT_PATHS = {
    "overrides": "key=value settings; a path in one (root=, model.init_from=) is checked by the config/storage",
    "text": "the words to speak",
    "description": "a voice description",
    "gpu_memory": "a size (80GB)",
    "host_memory": "a size (32GB)",
    "gpu": "a GPU name",
    "fmt": "an export format name",
    "kind": "an upstream format name",
    "asr_model": "a Whisper size or hub id (or folder): resolved where the scorer loads it",
    "utmos": "true, a URL or a weights file: read (or refused with a warning) where the scorer loads it",
    "name": "a template's name (voxrelay init --list)",
}
FILLERS = {"kind": "parler-config"}  # required non-path parameters


def _commands() -> dict[str, Any]:
    """Every command of the app (``config show`` included) by its name, as typer builds it."""
    found: dict[str, Any] = {}

    def walk(cmd, name: str) -> None:
        if hasattr(cmd, "commands"):
            for sub_name, sub in cmd.commands.items():
                walk(sub, f"{name} {sub_name}".strip())
        else:
            found[name] = cmd

    walk(typer.main.get_command(cli.app), "")
    return found


TEXT = (str, Path, list[str], list[Path])


def _texts(cmd) -> list:
    """The parameters of ``cmd`` whose values are text or paths (not numbers, not flags)."""
    hints = get_type_hints(inspect.unwrap(cmd.callback))
    return [p for p in cmd.params if hints[p.name] in TEXT]


def _declared_role(cmd, name: str):
    """The role the command declares for parameter ``name`` (its typer callback's ``path_role``), or None."""
    info = inspect.signature(inspect.unwrap(cmd.callback)).parameters[name].default
    return getattr(getattr(info, "callback", None), "path_role", None)


def _label(param) -> str:
    """How the command's usage names ``param``: its first option name, or an argument's name in capitals."""
    return param.opts[0] if param.param_type_name == "option" else param.name.upper()


def test_every_text_parameter_is_a_checked_path_or_listed_as_not_one() -> None:
    seen = set()
    for name, cmd in _commands().items():
        for p in _texts(cmd):
            seen.add((name, p.name))
            if p.name in NOT_PATHS:
                assert (name, p.name) not in ROLES
                continue
            assert (name, p.name) in ROLES, (
                f"`voxrelay {name}` has a new text parameter {p.name!r}: a path gets a role (voxrelay.cli.paths: "
                "reads/writes) and a line in ROLES here; anything else a line in NOT_PATHS")
            assert _declared_role(cmd, p.name) == ROLES[name, p.name][0], (name, p.name)
    assert set(ROLES) <= seen, sorted(set(ROLES) - seen)  # no stale line


def _bad_locations(role: tuple[str, str], tmp: Path) -> list[str]:
    """Places where ``role`` cannot work: missing, under a regular file, a pseudo filesystem, the wrong kind."""
    verb, kind = role
    name = "out.wav" if kind == "file" else "out"
    if verb == "write":
        wrong_kind = str(tmp / ("a-folder" if kind == "file" else "a-file"))
        return [f"/proc/voxrelay-missing/{name}", f"/sys/{name}", str(tmp / "a-file" / name), wrong_kind]
    wrong_kind = str(tmp / ("a-folder" if kind == "file" else "a-file"))
    return [str(tmp / "missing" / name), f"/proc/voxrelay-missing-{name}", str(tmp / "a-file" / name), wrong_kind]


def _good(role: tuple[str, str], tmp: Path) -> str:
    return {READ_FILE: tmp / "good.txt", READ_FOLDER: tmp / "a-folder", WRITE_FILE: tmp / "new" / "ok.wav",
            WRITE_FOLDER: tmp / "new-folder"}[role].as_posix()


def _cases() -> list[tuple[str, str, int]]:
    return [(command, param, i) for (command, param), (role, _) in ROLES.items()
            for i in range(len(_bad_locations(role, Path("/x"))))]


def _invoke(args: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> tuple[int, str]:
    """``voxrelay ARGS`` in this process: (exit code, stdout + stderr); an uncaught exception is exit 1 with
    its traceback, as the console script would show it."""
    monkeypatch.setattr(sys, "argv", ["voxrelay", *args])
    code = 0
    try:
        cli.main()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except Exception:  # what a user would see as a traceback
        code = 1
        print(traceback.format_exc(), file=sys.stderr)
    out = capsys.readouterr()
    return code, out.out + out.err


@pytest.fixture
def places(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    places = tmp_path / "places"
    places.mkdir()
    (places / "a-file").write_text("a regular file\n")
    (places / "a-folder").mkdir()
    (places / "good.txt").write_text("hello\n")
    monkeypatch.setenv("VOXRELAY_CACHE", str(tmp_path / "cache"))
    for name in ("TRANSFORMERS_VERBOSITY", "HF_HUB_VERBOSITY", "TOKENIZERS_PARALLELISM", "HF_HUB_CACHE"):
        if name in os.environ:  # main() sets these: as they were after the test
            monkeypatch.setenv(name, os.environ[name])
        else:
            monkeypatch.setenv(name, "")
            monkeypatch.delenv(name)
    return places


def _args(command: str, param: str, values: list[str], tmp: Path) -> list[str]:
    """The command line of ``command`` with ``values`` for ``param`` and good values for its other required
    parameters."""
    cmd = _commands()[command]
    args = command.split()
    for p in cmd.params:
        if p.name == param:
            given = values
        elif p.required:
            role = ROLES.get((command, p.name), (None,))[0]
            given = [FILLERS.get(p.name, "x") if role is None else _good(role, tmp)]
        else:
            continue
        args += given if p.param_type_name == "argument" else [a for v in given for a in (p.opts[0], v)]
    return args + (["hi"] if command == "synthesize" and param != "script" else [])  # TEXT, or --script


MEANINGS = {os.strerror(n) for n in errno.errorcode}


@pytest.mark.parametrize(("command", "param", "which"), _cases())
def test_a_path_that_cannot_be_used_is_exit_2_naming_it(command, param, which, places, monkeypatch, capsys) -> None:
    role, form = ROLES[command, param]
    bad = _bad_locations(role, places)[which]
    code, out = _invoke(_args(command, param, form(bad), places), monkeypatch, capsys)
    assert code == 2 and "Traceback" not in out, out
    lines = [line for line in out.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and bad in lines[0], out  # one line that names the path
    label = _label(next(p for p in _commands()[command].params if p.name == param))
    assert label in lines[0], out  # and the option it came from
    assert any(meaning in lines[0] for meaning in MEANINGS), out  # and what the system said (os.strerror)


def test_a_checked_output_leaves_no_trace(places, monkeypatch, capsys) -> None:
    """The probe (a file created and removed, in folders made for it and removed) leaves nothing behind: the
    command goes on to its own error (FILE is not upstream JSON) with the output's folders absent."""
    (places / "not.json").write_text("not json")
    code, out = _invoke(["import", "parler-config", str(places / "not.json"), "-o",
                         str(places / "new" / "sub" / "c.yaml")], monkeypatch, capsys)
    assert code == 2 and "not.json" in out, out
    assert sorted(p.name for p in places.iterdir()) == ["a-file", "a-folder", "good.txt", "not.json"]


@pytest.mark.parametrize("root", ["/sys/vr", "/proc/voxrelay-missing/vr", "a-file/vr"])
def test_a_root_that_cannot_be_written_is_exit_2_before_prepare_reads_a_source(root, places, monkeypatch,
                                                                                capsys) -> None:
    """``root`` comes from the config, not from an option: the storage layer checks it the same way (a file
    created and removed), before the sources are read."""
    root = str(places / root) if not root.startswith("/") else root
    code, out = _invoke(["prepare", str(cli.demo_config_path()), f"root={root}"], monkeypatch, capsys)
    assert code == 2 and "Traceback" not in out, out
    lines = [line for line in out.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and f"root {root!r}" in lines[0], out
    assert any(meaning in lines[0] for meaning in MEANINGS) and "set `root`" in lines[0], out
