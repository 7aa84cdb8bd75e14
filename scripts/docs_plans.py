"""Regenerate the ``$ voxrelay plan ...`` outputs of the memory-planning page (docs/memory.md) from real output.

Each command line of that page (``$ voxrelay plan ...`` inside a fenced block) is run as written, with
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
PAGE = ROOT / "docs" / "memory.md"
ORPHEUS_3B = {  # Llama-3.2-3B (canopylabs/orpheus-3b-0.1-pretrained's config.json), weights not needed to plan
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 3072, "intermediate_size": 8192,
    "num_attention_heads": 24, "num_key_value_heads": 8, "head_dim": 128, "num_hidden_layers": 28,
    "vocab_size": 156940, "tie_word_embeddings": True, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
    "hidden_act": "silu", "rope_theta": 500000.0, "bos_token_id": 128000, "eos_token_id": 128009,
}


def _run(command: str, orpheus: Path, root: Path) -> list[str]:
    args = shlex.split(command.split("  #")[0].replace("<orpheus-3b>", str(orpheus)))
    assert args[:2] == ["voxrelay", "plan"], command
    env = os.environ | {"HF_HUB_OFFLINE": "1", "COLUMNS": "250", "NO_COLOR": "1"}
    res = subprocess.run([sys.executable, "-m", "voxrelay", *args[1:], f"root={root}"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    if res.returncode not in (0, 3):  # 3: nothing fits, a planned answer too
        raise SystemExit(f"{command}\nexit {res.returncode}\n{res.stderr[-2000:]}")
    return [line.rstrip() for line in res.stdout.rstrip("\n").splitlines()]


def regenerate(text: str, orpheus: Path, root: Path) -> str:
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
            printed = _run(line[2:], orpheus, root)
            only = re.search(r"# its (\d+)-GPU table", line)  # the page shows that table alone
            if only:
                title = f"GB per GPU, {only.group(1)} GPUs,"
                printed = printed[next(n for n, p in enumerate(printed) if p.startswith(title)):]
            out.extend(printed)
            while i < end and not lines[i].startswith("```") and not lines[i].startswith("$ "):
                i += 1
            if i < end and lines[i].startswith("$ "):
                out.append("")
    return "\n".join(out + lines[end:]) + ("\n" if text.endswith("\n") else "")


def main() -> None:
    readme = PAGE
    with tempfile.TemporaryDirectory() as tmp:
        orpheus = Path(tmp) / "orpheus-3b"
        orpheus.mkdir()
        (orpheus / "config.json").write_text(json.dumps(ORPHEUS_3B, indent=1))
        new = regenerate(readme.read_text(), orpheus, Path(tmp) / "root")
    if "--check" in sys.argv:
        sys.exit(0 if new == readme.read_text() else 1)
    readme.write_text(new)


if __name__ == "__main__":
    main()
