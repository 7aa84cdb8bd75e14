"""The paths a command is given: each checked while typer parses the command line, and each remembered so
that an OSError on it later is a user error, not a traceback.

A path parameter declares what the command does with it by its callback (``callback=writes(...)``); the
check runs before the command's body imports torch or loads a model, so a path that cannot be read or
written fails in a second instead of after minutes of work. The check does what the command will do
(opens the file, lists the folder, creates and removes a file in the folder it writes): ``os.access`` says
yes to root everywhere and to anyone on /proc or /sys. Remote URIs (gs://, s3://) are the storage layer's
to check. Every local path checked is remembered (:data:`voxrelay.paths.GIVEN`): :func:`voxrelay.cli.main`
turns an OSError on one of them (a disk that fills up at the end) into exit 2 naming the option, the path
and the errno's meaning (:func:`voxrelay.paths.explain`); what was written before it stays where it is.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import Any

import typer

from voxrelay.errors import UserError
from voxrelay.paths import check_path, explain

AUDIO_SUFFIXES = (".wav", ".flac", ".mp3", ".ogg", ".opus", ".m4a", ".aac")


def _values(value: Any) -> list[str]:
    """The paths of a parameter's value (None, one value, or a list of them)."""
    if value is None:
        return []
    return [str(v) for v in value] if isinstance(value, list | tuple) else [str(value)]


def voice_files(value: Any) -> list[str]:
    """``--voice``: the prompt files of ``SPEAKER=clip.wav`` (or a bare ``clip.wav``); a speaker's name is
    not a path."""
    specs = _values(value)
    paths = [spec.partition("=")[2] if "=" in spec else spec for spec in specs]
    return [p for spec, p in zip(specs, paths, strict=True) if "=" in spec or p.lower().endswith(AUDIO_SUFFIXES)]


def sweep_file(value: Any) -> list[str]:
    """``sweep``'s arguments: ``SWEEP.yaml [overrides]`` or ``status SWEEP.yaml [overrides]``."""
    args = _values(value)
    return args[1:2] if args[:1] == ["status"] and len(args) > 1 else args[:1]


def _local(value: str) -> str | None:
    if value.startswith("file://"):
        return value.removeprefix("file://")
    return None if "://" in value else value


def _label(param: Any) -> str:
    """How the command's usage names ``param``: its first option name, or an argument's name in capitals."""
    return param.opts[0] if param.param_type_name == "option" else param.name.upper()


def _role(writes: bool, folder: bool, fix: str, pick: Callable[[Any], list[str]]) -> Callable[..., Any]:
    def check(ctx: typer.Context, param: typer.CallbackParam, value: Any) -> Any:
        if ctx.resilient_parsing:  # shell completion: nothing runs
            return value
        for shown in pick(value):
            local = _local(shown)
            if local is None:
                continue
            check_path(local, _label(param), fix, writes=writes, folder=folder)  # remembered for explain()
        return value

    check.path_role = ("write" if writes else "read", "folder" if folder else "file")  # for the tests
    return check


def reads(fix: str, folder: bool = False, pick: Callable[[Any], list[str]] = _values) -> Callable[..., Any]:
    """A typer callback: the file (``folder``: folder) the parameter names must be readable; ``pick`` finds the
    paths in its value."""
    return _role(False, folder, fix, pick)


def writes(fix: str, folder: bool = False) -> Callable[..., Any]:
    """A typer callback: the file the parameter names (``folder``: files in that folder) must be writable: its
    folder is made if missing, a file created and removed in it (and the folders made, removed again)."""
    return _role(True, folder, fix, _values)


def user_message(err: UserError | OSError, verbose: bool = False) -> str | None:
    """The one line to exit 2 with: a user error's message, or an OSError's on a path the user gave (with
    ``verbose`` its traceback too, to stderr); None for any other OSError (a bug: shown whole)."""
    if isinstance(err, UserError):
        return str(err)
    message = explain(err)
    if message is not None and verbose:
        traceback.print_exc()
    return message
