"""Run ``python -m voxrelay ARGS`` with this process's clock skewed when its torchrun rank is the one in
``$SKEWED_RANK``: ``time.time`` and ``time.monotonic`` run ``$SKEW_RATE`` times as fast from the start.
A stand-in for the processes of one job whose clocks (and so time intervals, time limits and measured save
costs) disagree. Used by tests/integration/test_decisions.py:

    torchrun --nproc-per-node=2 tests/helpers/skewed_clock.py train CONFIG ...
"""

import os
import sys
import time

if os.environ.get("RANK") == os.environ.get("SKEWED_RANK"):
    rate, real_time, real_monotonic = float(os.environ["SKEW_RATE"]), time.time, time.monotonic
    t0, m0 = real_time(), real_monotonic()
    time.time = lambda: t0 + (real_time() - t0) * rate
    time.monotonic = lambda: m0 + (real_monotonic() - m0) * rate

sys.path.insert(0, os.getcwd())
from voxrelay.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.argv[0] = "voxrelay"
    main()
