"""How long MCD-DTW takes on two 5-second clips (what each eval sample costs), measured over a few repeats; the
budget is 0.5 s on 2 CPU cores (a timing target: a bench, not a test, since the machines are shared and noisy).

    .venv/bin/python bench/mcd_speed.py [--repeats 5]

Last line: ``ratio <median seconds / 0.5>`` (goal < 1).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.unit.quality.test_mcd import SR, speechlike, with_noise  # noqa: E402
from voxrelay.quality.mcd import mcd_dtw  # noqa: E402

BUDGET_S = 0.5


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    a, b = speechlike(5.0, 0), with_noise(speechlike(5.0, 0), 10)
    mcd_dtw(a, b, SR)  # warm-up: filterbank cache, torch first call
    times = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        mcd_dtw(a, b, SR)
        times.append(time.perf_counter() - start)
    median = statistics.median(times)
    print(f"mcd_dtw on two 5 s clips: median {median * 1000:.0f} ms over {args.repeats} "
          f"(budget {BUDGET_S * 1000:.0f} ms)")
    print(f"ratio {median / BUDGET_S:.3f}")


if __name__ == "__main__":
    main()
