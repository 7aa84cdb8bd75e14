"""The documentation as a user meets it: a short README whose links all lead somewhere, a docs site that builds
strictly (a broken link or anchor, a page left out of the navigation fails), no internal labels, the version, and
the example configs reachable from an installed package (`voxrelay init`) with header commands the CLI accepts."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import typer
import yaml
from typer.testing import CliRunner

import voxrelay
from voxrelay.cli import app
from voxrelay.cli.start import templates
from voxrelay.errors import UserError

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def test_the_readme_is_short_and_every_link_in_it_leads_to_a_file():
    readme = (REPO / "README.md").read_text()
    assert len(readme.encode()) <= 10_000, len(readme.encode())
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme)
    local = [link for link in links if "://" not in link]
    assert len(local) >= 15, local  # the use cases' quickstarts and the docs' pages
    assert [link for link in local if not (REPO / link).is_file()] == []
    assert "<!--" not in readme, "generated reference material belongs in docs/reference/"


def build_site(folder: Path, site: Path) -> subprocess.CompletedProcess:
    """``mkdocs build --strict`` of ``folder`` (mkdocs.yml + docs/), as CI runs it: without ``-q``, which hides
    the warnings that ``--strict`` turns into a failure."""
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(site)], cwd=folder,
                          capture_output=True, text=True, timeout=300,
                          env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"})


def test_the_docs_site_builds_strictly(tmp_path: Path):
    res = build_site(REPO, tmp_path / "site")
    assert res.returncode == 0, res.stdout + res.stderr
    built = {p.relative_to(tmp_path / "site").as_posix() for p in (tmp_path / "site").rglob("index.html")}
    for page in (REPO / "docs").rglob("*.md"):
        rel = page.relative_to(REPO / "docs").with_suffix("").as_posix()
        assert ("index.html" if rel == "index" else f"{rel}/index.html") in built, rel


@pytest.mark.parametrize("breakage", ["a link to a missing page", "a missing anchor", "a page out of the nav"])
def test_the_strict_build_fails_on_a_broken_link_anchor_or_a_page_left_out(breakage: str, tmp_path: Path):
    import shutil

    shutil.copytree(REPO / "docs", tmp_path / "docs")
    shutil.copy(REPO / "mkdocs.yml", tmp_path / "mkdocs.yml")
    index = tmp_path / "docs" / "index.md"
    if breakage == "a link to a missing page":
        index.write_text(index.read_text() + "\nSee [the missing page](no-such-page.md).\n")
    elif breakage == "a missing anchor":
        index.write_text(index.read_text() + "\nSee [memory](memory.md#no-such-heading).\n")
    else:
        (tmp_path / "docs" / "orphan.md").write_text("# Orphan\n\nIn no nav.\n")
    res = build_site(tmp_path, tmp_path / "site")
    said = res.stdout + res.stderr
    assert res.returncode == 1 and "Aborted with" in said, said[-2000:]
    assert {"a link to a missing page": "no-such-page.md", "a missing anchor": "no-such-heading",
            "a page out of the nav": "orphan.md"}[breakage] in said, said[-2000:]


def test_every_plan_output_in_the_docs_is_what_plan_prints_now():
    """The `$ voxrelay plan ...` blocks (memory planning, the quickstarts' real-scale plans): rerun, compared."""
    res = subprocess.run([sys.executable, str(REPO / "scripts" / "docs_plans.py"), "--check"], cwd=REPO,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr[-3000:] + "\n(run scripts/docs_plans.py to rewrite them)"


def test_no_page_speaks_of_internal_labels():
    """Use cases, not the labels of the users' posts the project was built from."""
    texts = {p: p.read_text() for p in [*PAGES, *EXAMPLES.iterdir()] if p.is_file()}
    found = {str(p.relative_to(REPO)): m.group(0) for p, t in texts.items()
             for m in [re.search(r"(?i)seeds?[ _-]?0\d\d", t)] if m}
    assert found == {}


def test_version_is_the_package_version():
    res = CliRunner().invoke(app, ["--version"])
    assert res.exit_code == 0 and res.output.strip() == f"voxrelay {voxrelay.__version__}"
    project = (REPO / "pyproject.toml").read_text()
    assert f'version = "{voxrelay.__version__}"' in project


def test_every_example_is_a_template_and_init_writes_it_naming_the_new_file(tmp_path: Path, monkeypatch):
    from voxrelay.config import load_config

    shipped = templates()
    assert {p.name for p in shipped.values()} == {p.name for p in EXAMPLES.iterdir() if p.suffix in (".yaml",
                                                                                                       ".ipynb")}
    monkeypatch.chdir(tmp_path)
    for name, source in shipped.items():
        res = CliRunner().invoke(app, ["init", name, "-o", f"mine/{name}{source.suffix}"])
        assert res.exit_code == 0, res.output
        written = tmp_path / "mine" / f"{name}{source.suffix}"
        text = written.read_text()
        assert f"examples/{source.name}" not in text
        if f"examples/{source.name}" in source.read_text():
            assert f"mine/{name}{source.suffix}" in text
        if "model" in (yaml.safe_load(text) if source.suffix == ".yaml" else {}):
            assert load_config(written).to_dict() == load_config(source).to_dict(), name
    res = CliRunner().invoke(app, ["init", "orpheus-lora", "-o", "mine/orpheus-lora.yaml"])  # main() exits 2 on it
    assert isinstance(res.exception, UserError) and "--force" in str(res.exception)  # an edited file is kept
    res = CliRunner().invoke(app, ["init", "orpheus"])
    assert isinstance(res.exception, UserError) and "did you mean orpheus-colab-t4, orpheus-lora?" in str(res.exception)
    listed = CliRunner().invoke(app, ["init", "--list"]).output
    assert all(re.search(rf"^{re.escape(n)}\s+\S", listed, re.M) for n in shipped), listed


def test_the_wheel_ships_every_template(tmp_path: Path):
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(REPO),
                          "-w", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    (wheel,) = tmp_path.glob("voxrelay-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = {Path(n).name for n in z.namelist() if n.startswith("voxrelay/templates/")}
        assert names == {p.name for p in templates().values()}
        assert z.read("voxrelay/templates/orpheus-lora.yaml") == (EXAMPLES / "orpheus-lora.yaml").read_bytes()


def header_commands(path: Path) -> list[list[str]]:
    """The voxrelay commands in an example's header comment, as argument lists: the indented command lines
    (continuations joined, a Colab cell's `!` dropped) and the `voxrelay ...` spans quoted in its prose."""
    lines, commands, pending = [], [], ""
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line[1:])
    for line in lines:
        quoted = re.findall(r"`(voxrelay [^`]+)`", line)
        line = pending + line
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        pending = ""
        text = line.strip().lstrip("!")
        if line.startswith("  ") and re.match(r"(voxrelay|accelerate launch|torchrun) ", text):
            quoted.append(text.split("  #")[0])
        for command in quoted:
            words = shlex.split(command)
            commands.append(words[words.index("voxrelay") + 1:])
    return commands


def test_header_commands_are_the_indented_lines_and_the_quoted_spans(tmp_path: Path):
    example = tmp_path / "x.yaml"
    example.write_text("# voxrelay as a job: prose, `voxrelay plan x.yaml --gpu t4` quoted\n#\n"
                       "#   voxrelay prepare x.yaml root=/r   # a comment\n#   !voxrelay train x.yaml \\\n"
                       "#     a=1\nname: x\n# voxrelay status after the header\n")
    assert header_commands(example) == [["plan", "x.yaml", "--gpu", "t4"], ["prepare", "x.yaml", "root=/r"],
                                        ["train", "x.yaml", "a=1"]]


@pytest.mark.parametrize("example", sorted(p.name for p in EXAMPLES.glob("*.yaml")))
def test_every_command_in_an_examples_header_is_one_the_cli_accepts(example: str, monkeypatch):
    """Each `voxrelay ...` line of a header parses (its command and options exist) and its config with the line's
    overrides loads."""
    from voxrelay.config import load_config

    monkeypatch.chdir(REPO)
    group = typer.main.get_command(app)
    commands = header_commands(EXAMPLES / example)
    assert commands, f"{example}'s header shows no voxrelay command"
    for args in commands:
        command, rest = group, list(args)
        while hasattr(command, "list_commands"):  # a group (typer's own click: not click.Group)
            name = rest.pop(0)
            command = command.get_command(command.context_class(command), name)
            assert command is not None, f"{example}: no command {name!r} in {args}"
        opts, positional, _ = command.make_parser(command.context_class(command)).parse_args(list(rest))
        config = next((p for p in positional if p.endswith(".yaml") and (REPO / p).is_file()), None)
        if config and command.name != "sweep":
            load_config(REPO / config, [p for p in positional if "=" in p])
