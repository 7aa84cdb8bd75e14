"""voxrelay's packed Orpheus-3B-width tokens/s over the HF Trainer's and Unsloth's, from ``gpu_suite.sh``'s logs
(``orpheus3b_pack.log`` from ``bench/packing.py``, ``unsloth.log`` from ``bench/unsloth_arm.py``: each arm's
row of their tables), with the issue's goals; ``n/a`` where an arm did not run.

    .venv/bin/python bench/suite_ratios.py OUT_DIR
"""

from __future__ import annotations

import sys
from pathlib import Path


def tokens_per_s(log: Path, arm: str) -> float | None:
    """The tokens/s column of ``arm``'s last row in a ``bench/packing.py``-style table (None: no such row)."""
    if not log.is_file():
        return None
    rows = [parts for parts in map(str.split, log.read_text().splitlines())
            if parts and parts[0] == arm and len(parts) >= 5 and parts[-2].endswith("%")]  # ... MFU, max GiB
    try:
        return float(rows[-1][-3]) if rows else None
    except (IndexError, ValueError):
        return None


def main() -> None:
    out = Path(sys.argv[1])
    ours = tokens_per_s(out / "orpheus3b_pack.log", "packed")
    for name, other, goal in (("HF Trainer", tokens_per_s(out / "orpheus3b_pack.log", "hf_trainer"), 1.5),
                              ("Unsloth", tokens_per_s(out / "unsloth.log", "unsloth"), 1.0)):
        ratio = f"{ours / other:.3f} (goal >= {goal})" if ours and other else "n/a"
        print(f"voxrelay packed / {name} tokens/s: {ratio}")


if __name__ == "__main__":
    main()
