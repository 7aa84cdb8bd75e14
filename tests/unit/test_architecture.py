"""The package's structure, checked: no import cycle between modules, and the layers that must not reach up (plan and
inference never import train; nothing outside models/ names a family: tests/unit/train/test_family_seam.py)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

SRC = Path(__file__).parents[2] / "src" / "voxrelay"


def _module_imports() -> dict[str, set[str]]:
    """Module -> the voxrelay modules it imports when it is imported (module level, not under TYPE_CHECKING; an
    import inside a function runs later and makes no cycle), and its package: importing ``a.b.c`` runs ``a.b``'s
    ``__init__`` first."""
    names = {".".join(p.relative_to(SRC.parent).with_suffix("").parts).removesuffix(".__init__"): p
             for p in SRC.rglob("*.py")}
    graph = {}
    for name, path in names.items():
        deps = set()
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("voxrelay"):
                deps |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in names else node.module
                         for a in node.names}
            elif isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name.startswith("voxrelay")}
        parent = name.rsplit(".", 1)[0]
        graph[name] = {d for d in deps | {parent} if d in names and d != name}
    return graph


def _harmful(cycle: list[str]) -> bool:
    """A package whose ``__init__`` imports its own submodules makes a cycle with them that Python resolves (the
    package finishes importing them first); one through a module outside the package does not: that module can
    be met half-initialised (a section config importing ``voxrelay.config.fields`` first once did)."""
    top = min(cycle, key=len)
    return any(m != top and not m.startswith(top + ".") for m in cycle)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while (w := stack.pop()) != v:
                part.append(w)
            if part:
                found.append(sorted([v, *part]))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_module_imports_itself_back_through_others():
    graph = _module_imports()
    assert len(graph) > 100 and "voxrelay.cli.app" in graph["voxrelay.cli.pipeline"]
    assert "voxrelay.config" in graph["voxrelay.config.fields"]  # a module's package is imported before it
    assert [c for c in _cycles(graph) if _harmful(c)] == []


def test_the_cycle_check_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    # the config/ package's first cycle: quality.config -> config.fields -> (its package) config -> quality.config
    broken = {"v.quality.config": {"v.config.fields"}, "v.config.fields": {"v.config"},
              "v.config": {"v.quality.config", "v.config.fields"}}
    assert [_harmful(c) for c in _cycles(broken)] == [True]
    assert not _harmful(["v.models.parler", "v.models.parler.config"])  # a package importing its submodule


def test_plan_and_inference_never_import_train():
    """plan/ is what train calls to check a run fits, and inference loads what training wrote: neither reaches into
    train/ (the ``train:`` section's config, voxrelay.train.config, is the config's)."""
    reach = re.compile(r"^\s*(?:from|import) voxrelay\.train(?!\.config\b)\b", re.M)
    files = [*(SRC / "plan").rglob("*.py"), *(SRC / "inference").rglob("*.py")]
    offenders = [str(p.relative_to(SRC)) for p in files if reach.search(p.read_text())]
    assert len(files) > 5 and not offenders, offenders


# a CheckpointManager's parts, reached through it (src names a manager ``checkpoints``, or makes one in place)
MANAGER_PARTS = re.compile(r"(?:checkpoints|CheckpointManager\([^)]*\))\.(?:uploader|staging|store)\b")


def test_outside_checkpoint_nothing_reaches_past_the_manager():
    """train/ (and every other package) asks the CheckpointManager (open, save, health, save_failed, commit_now, ...),
    never its upload thread, staging folder or committed store: what a checkpoint is and how it travels stays in
    checkpoint/. ``.store``/``.staging``/``.uploader`` as an attribute outside checkpoint/ is a reach past it."""
    files = [p for p in SRC.rglob("*.py") if "checkpoint" not in p.relative_to(SRC).parts]
    offenders = {str(p.relative_to(SRC)): MANAGER_PARTS.findall(p.read_text()) for p in files}
    assert len(files) > 100 and {k: v for k, v in offenders.items() if v} == {}


def test_the_reach_check_sees_a_reach():
    for reach in ("run.checkpoints.uploader.failed_saves", "checkpoints.store.upload(x)",
                  "CheckpointManager(uri, reader=True).staging.list()"):
        assert MANAGER_PARTS.search(reach), reach
    assert not MANAGER_PARTS.search("from voxrelay.checkpoint.staging import Staging")
    assert not MANAGER_PARTS.search("run.checkpoints.health().fatal")
