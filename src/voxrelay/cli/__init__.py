"""The ``voxrelay`` command. Thin: parse -> config -> call the library. One module per group of commands, each
registering its commands on :data:`voxrelay.cli.app.app` when imported here, in the order ``--help`` lists them."""

from __future__ import annotations

import sys

from rich.markup import escape

from voxrelay.checkpoint.stops import EXIT_ABORTED, EXIT_USER_ERROR
from voxrelay.cli.app import (  # noqa: F401 (the CLI's public names)
    CONFIG,
    OVERRIDES,
    OWN_LINES,
    _setup_logging,
    app,
    demo_config_path,
    err,
    out,
)
from voxrelay.cli.paths import user_message
from voxrelay.errors import UserError
from voxrelay.paths import GIVEN

# isort: off
# each registers its commands on the app: the order of `voxrelay --help` (and of docs/reference/cli.md)
from voxrelay.cli import pipeline  # noqa: E402,F401 (config show, prepare, train, plan, status)
from voxrelay.cli import speech  # noqa: E402,F401 (synthesize, eval, voices, export, import)
from voxrelay.cli import demo  # noqa: E402,F401
from voxrelay.cli import ops  # noqa: E402,F401 (doctor, sweep)
from voxrelay.cli import start  # noqa: E402,F401 (init)
# isort: on


def main() -> None:
    """Entry point: a :class:`UserError`, or an OSError on a path the user gave (a disk full at the end), exits
    2 with one line, Ctrl-C exits 130; neither prints a traceback.

    Training handles SIGINT itself (saves, exit 130); typer turns a KeyboardInterrupt inside a
    command into exit 130 as well; this catches the ones outside (start-up, logging set-up).
    """
    GIVEN.clear()
    try:
        _setup_logging()
        app()
    except (UserError, OSError) as e:
        if (message := user_message(e, OWN_LINES.verbose)) is None:
            raise  # an OSError not on a path of the user's: a bug, shown whole
        err.print(f"[red]error:[/red] {escape(message)}", highlight=False)  # a message is text, not markup
        sys.exit(EXIT_USER_ERROR)
    except KeyboardInterrupt:
        err.print("interrupted", highlight=False)
        sys.exit(EXIT_ABORTED)
