"""Regenerate the generated reference pages of the docs: the configuration reference (docs/reference/config.md,
from voxrelay/config/) and the command reference (docs/reference/cli.md, from the CLI's own options and help)."""

from pathlib import Path

import typer

from voxrelay.cli import app
from voxrelay.config.reference import reference_markdown

REFERENCE = Path(__file__).parents[1] / "docs" / "reference"
PAGES = {  # the page, and each generated block in it (between its start and end markers)
    REFERENCE / "config.md": {"config-reference": reference_markdown},
    REFERENCE / "cli.md": {"command-reference": lambda: command_reference_markdown()},
}


def _commands(group, prefix: str = "voxrelay") -> list:
    out = []
    for name in sorted(group.commands):
        cmd = group.commands[name]
        if hasattr(cmd, "commands"):
            out += _commands(cmd, f"{prefix} {name}")
        else:
            out.append((f"{prefix} {name}", cmd))
    return out


def command_reference_markdown() -> str:
    """Every command with its arguments and options, as the CLI defines them (so `--help` and the
    reference page cannot disagree: a test compares them)."""
    lines: list[str] = []
    for path, cmd in _commands(typer.main.get_command(app)):
        args = [p.name.upper() if p.required else f"[{p.name.upper()}]..."
                for p in cmd.params if p.param_type_name == "argument"]
        lines += [f"**`{' '.join([path, *args])}`**", "", (cmd.help or "").strip().splitlines()[0], "",
                  "| argument / option | default | meaning |", "|---|---|---|"]
        for p in cmd.params:
            if p.param_type_name == "argument":
                lines.append(f"| `{p.name.upper()}` | {'required' if p.required else ''} | "
                             f"{getattr(p, 'help', '') or ''} |")
            elif p.name != "help":
                default = "required" if p.required else "" if getattr(p, "is_flag", False) or p.default is None \
                    else f"`{p.default}`"
                lines.append(f"| `{', '.join(p.opts)}` | {default} | {p.help or ''} |")
        lines.append("")
    return "\n".join(lines).replace("<", "&lt;").replace(">", "&gt;")  # `<root>` is not an HTML tag


def render(readme: str, blocks: dict) -> str:
    for name, make in blocks.items():
        start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
        head, rest = readme.split(start, 1)
        _, tail = rest.split(end, 1)
        readme = f"{head}{start}\n{make()}{end}{tail}"
    return readme


if __name__ == "__main__":
    for path, blocks in PAGES.items():
        path.write_text(render(path.read_text(), blocks))
