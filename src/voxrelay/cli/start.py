"""``voxrelay init``: a starter config (or notebook, or job template) from the examples shipped in the package,
written where the user wants it; ``voxrelay init --list`` names them."""

from __future__ import annotations

import difflib
import json
from importlib import resources
from pathlib import Path

import typer

from voxrelay.cli.app import app, err, out
from voxrelay.cli.paths import writes
from voxrelay.errors import UserError


def templates() -> dict[str, Path]:
    """Every shipped template by name (its file name without the suffix): the repository's examples/."""
    folder = Path(str(resources.files("voxrelay") / "templates"))
    return {p.name.rsplit(".", 1)[0]: p for p in sorted(folder.iterdir()) if p.suffix in (".yaml", ".ipynb")}


def summary(path: Path) -> str:
    """A template's first line of description (the header comment of a YAML file, a notebook's title)."""
    text = path.read_text()
    if path.suffix == ".ipynb":
        markdown = next((c for c in json.loads(text)["cells"] if c["cell_type"] == "markdown"), None)
        return "".join(markdown["source"]).splitlines()[0].lstrip("# ").strip() if markdown else ""
    head = []
    for line in text.splitlines():
        if not line.startswith("#") or line.strip() == "#":
            break
        head.append(line.lstrip("# ").strip())
    said = " ".join(head).replace(f"examples/{path.name}", path.name)  # the file as `init` writes it
    said = said[:said.index(". ") + 1] if ". " in said else said
    return said if len(said) <= 110 else said[:109].rstrip(" ,;:") + "…"


def template_text(path: Path, dest: str) -> str:
    """The template as a user's own file: the commands in its header name ``dest`` instead of examples/<file>."""
    return path.read_text().replace(f"examples/{path.name}", dest)


@app.command("init")
def init_cmd(
    name: str = typer.Argument(None, help="The template's name (--list names them)"),
    output: str = typer.Option(None, "--output", "-o", help="Where to write it (default: ./<name>.yaml)",
                               callback=writes("pass another -o (the file to write)")),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing file"),
    list_them: bool = typer.Option(False, "--list", help="List the templates with what each is for"),
):
    """Write a starter config (or notebook, or job template) from the examples shipped with voxrelay."""
    found = templates()
    if list_them or name is None:
        width = max(map(len, found))
        for key, path in found.items():
            out.print(f"{key:<{width}}  {summary(path)}", highlight=False)
        if name is None:
            err.print("voxrelay init NAME -o FILE writes one", highlight=False)
        return
    if name not in found:
        close = [n for n in found if n.startswith(name)] or difflib.get_close_matches(name, found)
        hint = f"did you mean {', '.join(close)}? " if close else ""
        raise UserError(f"no template named {name!r}; {hint}the templates: {', '.join(found)} (voxrelay init --list)")
    source = found[name]
    dest = Path(output or f"{name}{source.suffix}")
    if dest.exists() and not force:
        raise UserError(f"{dest} exists: pass another -o FILE, or --force to overwrite it")
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(template_text(source, str(output or dest)))
    out.print(str(dest), highlight=False)
