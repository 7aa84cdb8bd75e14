"""Regenerate the ``$ voxrelay plan ...`` outputs of the docs (the memory-planning page, docs/memory.md, and the
quickstarts' real-scale plans) from real output.

Each command line of those pages (``$ voxrelay plan ...`` inside a fenced block) is run as written, with
``<orpheus-3b>`` standing for a config-only folder of Orpheus-3B (Llama-3.2-3B's shapes over the 156,940-token
vocabulary, tied embeddings: the numbers the page quotes), offline, on a wide terminal; the lines after it up to
the next command or the end of the block are replaced by what it printed (a command commented ``# its N-GPU
table`` keeps that table and what follows it).

    .venv/bin/python scripts/docs_plans.py [--check]

``--check`` exits 1 when the page differs from what the commands print now (nothing is written).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "docs" / "memory.md", *sorted((ROOT / "docs" / "quickstart").glob("*.md"))]
ORPHEUS_3B = {  # Llama-3.2-3B (canopylabs/orpheus-3b-0.1-pretrained's config.json), weights not needed to plan
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 3072, "intermediate_size": 8192,
    "num_attention_heads": 24, "num_key_value_heads": 8, "head_dim": 128, "num_hidden_layers": 28,
    "vocab_size": 156940, "tie_word_embeddings": True, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
    "hidden_act": "silu", "rope_theta": 500000.0, "bos_token_id": 128000, "eos_token_id": 128009,
}


def _commands(text: str) -> list[str]:
    return [line[2:] for line in text.splitlines() if line.startswith("$ voxrelay plan ")]


def _run_all(commands: list[str], orpheus: Path, root: Path) -> dict[str, list[str]]:
    """What each ``voxrelay plan`` command prints, all run in one interpreter (tests/helpers/cli_batch.py: each as
    ``python -m voxrelay`` runs it), offline, on a wide terminal."""
    batch = {}
    for command in commands:
        args = shlex.split(command.split("  #")[0].replace("<orpheus-3b>", str(orpheus)))
        assert args[:2] == ["voxrelay", "plan"], command
        batch[command] = [*args[1:], f"root={root}"]
    env = os.environ | {"HF_HUB_OFFLINE": "1", "COLUMNS": "250", "NO_COLOR": "1"}
    res = subprocess.run([sys.executable, str(ROOT / "tests" / "helpers" / "cli_batch.py")], input=json.dumps(batch),
                         cwd=ROOT, env=env | {"PYTHONPATH": str(ROOT / "src")}, capture_output=True, text=True,
                         timeout=1200)
    if res.returncode != 0:
        raise SystemExit(res.stderr[-3000:])
    printed = {}
    for command, result in json.loads(res.stdout).items():
        if result["returncode"] not in (0, 3):  # 3: nothing fits, a planned answer too
            raise SystemExit(f"{command}\nexit {result['returncode']}\n{result['stderr'][-2000:]}")
        printed[command] = [line.rstrip() for line in result["stdout"].rstrip("\n").splitlines()]
    return printed


def regenerate(text: str, printed: dict[str, list[str]]) -> str:
    lines = text.splitlines()
    start, end = 0, len(lines)
    out, i, fenced = lines[:start], start, False
    while i < end:
        line = lines[i]
        out.append(line)
        i += 1
        if line.startswith("```"):
            fenced = not fenced
            continue
        if fenced and line.startswith("$ voxrelay plan "):
            shown = printed[line[2:]]
            only = re.search(r"# its (\d+)-GPU table", line)  # the page shows that table alone
            if only:
                title = f"GB per GPU, {only.group(1)} GPUs,"
                shown = shown[next(n for n, p in enumerate(shown) if p.startswith(title)):]
            out.extend(shown)
            while i < end and not lines[i].startswith("```") and not lines[i].startswith("$ "):
                i += 1
            if i < end and lines[i].startswith("$ "):
                out.append("")
    return "\n".join(out + lines[end:]) + ("\n" if text.endswith("\n") else "")


def main() -> None:
    pages = {page: page.read_text() for page in PAGES}
    with tempfile.TemporaryDirectory() as tmp:
        orpheus = Path(tmp) / "orpheus-3b"
        orpheus.mkdir()
        (orpheus / "config.json").write_text(json.dumps(ORPHEUS_3B, indent=1))
        printed = _run_all([c for text in pages.values() for c in _commands(text)], orpheus, Path(tmp) / "root")
    stale = [page for page, text in pages.items() if regenerate(text, printed) != text]
    if "--check" not in sys.argv:
        for page in stale:
            page.write_text(regenerate(pages[page], printed))
    if stale:
        print(("differ from what plan prints now: " if "--check" in sys.argv else "rewrote: ")
              + ", ".join(str(page.relative_to(ROOT)) for page in stale))
    sys.exit(1 if stale and "--check" in sys.argv else 0)


if __name__ == "__main__":
    main()
