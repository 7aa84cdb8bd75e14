"""The command reference page (docs/reference/cli.md) lists every command and every option that the CLI's own
`--help` shows (the page is generated, but this reads the help a user sees, independently of the generator)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from voxrelay.cli import app

PAGE = (Path(__file__).parents[2] / "docs" / "reference" / "cli.md").read_text()
BLOCK = PAGE.split("<!-- command-reference:start -->", 1)[1].split("<!-- command-reference:end -->", 1)[0]
COMMANDS = [["config", "show"], ["demo"], ["doctor"], ["eval"], ["export"], ["import"], ["init"], ["plan"], ["prepare"],
            ["status"], ["sweep"], ["synthesize"], ["train"], ["voices"]]


def _section(command: list[str]) -> str:
    title = "**`voxrelay " + " ".join(command)
    assert title in BLOCK, f"docs/reference/cli.md has no command reference for {' '.join(command)}"
    return BLOCK.split(title, 1)[1].split("**`voxrelay ", 1)[0]


def test_every_command_of_the_cli_is_in_the_reference():
    help_text = CliRunner().invoke(app, ["--help"], terminal_width=200).output
    listed = set(re.findall(r"│ (\w+)\s", help_text)) - {"config"}
    assert listed == {c[0] for c in COMMANDS if c[0] != "config"}, listed


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_every_option_of_a_command_is_in_its_reference_section(command):
    res = CliRunner().invoke(app, [*command, "--help"], terminal_width=200)
    assert res.exit_code == 0, res.output
    # the options panel: lines like "│ *  --output  -o  PATH  Output .wav"
    options = {o for m in re.finditer(r"^│\s+(?:\*\s+)?(--[a-z][a-z-]*)(?:\s+(-[a-z])\b)?", res.output, re.M)
               for o in m.groups() if o} - {"--help"}
    section = _section(command)
    missing = sorted(o for o in options if not any(form in section for form in (f"`{o}`", f"{o},", f", {o}`")))
    assert not missing, (f"the reference's `voxrelay {' '.join(command)}` section lacks {missing}; run "
                         "scripts/update_reference.py")
    assert options == _defined_options(command), res.output  # the help was read whole, for every command


def _defined_options(command: list[str]) -> set[str]:
    """The options the command defines (its click parameters), what its --help must show."""
    import typer

    cmd = typer.main.get_command(app)
    for name in command:
        cmd = cmd.commands[name]
    return {o for p in cmd.params if p.param_type_name == "option" for o in [*p.opts, *p.secondary_opts]} - {"--help"}
