"""Does the demo talk, and how long does it take? Runs the demo's stages (prepare, train) on a
config (default: the demo's own), then scores the final checkpoint on every held-out text with
the run's eval settings (Whisper base packed, as `voxrelay eval`). Prints wall times, MCD-DTW,
CER, speaker similarity; the last line is the WER.

    .venv/bin/python bench/demo_quality.py [--config examples/demo.yaml] [--root DIR] [key=value ...]

Wall time depends on the host (they differ ~3x here): compare it with bench/loop_overhead.py's
bare-loop ms/step on the same machine.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch

from voxrelay.cli import demo_config_path
from voxrelay.config import load_config
from voxrelay.data.prepare import prepare
from voxrelay.quality.report import evaluate_source
from voxrelay.train.build import build_run
from voxrelay.train.loop import train


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(demo_config_path()))
    parser.add_argument("--root", default=None, help="storage root (default: a temporary folder)")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    root = args.root or tempfile.mkdtemp(prefix="demo-quality-")
    cfg = load_config(args.config, [f"root={root}", *args.overrides])
    print(f"config {args.config} {' '.join(args.overrides)}; root {root}; torch threads {torch.get_num_threads()}")
    t0 = time.perf_counter()
    prepare(cfg)
    t1 = time.perf_counter()
    result = train(build_run(cfg))
    t2 = time.perf_counter()
    if result.exit_code:
        raise SystemExit(f"train exited {result.exit_code}")
    (step, metrics), = evaluate_source(cfg.run_uri)
    t3 = time.perf_counter()
    print(f"prepare {t1 - t0:.0f} s, train {t2 - t1:.0f} s ({cfg.train.max_steps} steps, "
          f"{(t2 - t1) / cfg.train.max_steps:.2f} s/step incl. evals), demo total {t2 - t0:.0f} s; "
          f"scoring {t3 - t2:.0f} s")
    m = {key.split("/", 1)[1]: value for key, value in metrics.items()}
    nan = float("nan")
    print(f"step {step}: eval loss {m.get('loss', nan):.3f}, MCD-DTW {m.get('mcd_dtw', nan):.2f} dB, "
          f"CER {m.get('cer', nan):.3f}, speaker similarity {m.get('speaker_sim', nan):.3f}")
    print(f"WER {m.get('wer', nan):.3f}")


if __name__ == "__main__":
    main()
