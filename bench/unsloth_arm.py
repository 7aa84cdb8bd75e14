"""The Unsloth arm of ``bench/packing.py``'s Orpheus-layout comparison, in its own process (Unsloth patches
transformers' Llama classes when it is imported, so it cannot share a process with voxrelay's arms).

The same random-init Llama at the same width (built by voxrelay's Orpheus family, seed 0, saved with the Llama-3
tokenizer), the same rows and examples, loaded by ``unsloth.FastLanguageModel`` in bf16 with its LoRA at the
family's defaults (r 32, alpha 64, rsLoRA, every projection; the new embedding rows voxrelay also trains are left
frozen here: Unsloth has no per-row training, which only lightens its step) and its own gradient checkpointing
(``"unsloth"``), trained by a Hugging Face ``Trainer`` exactly as ``bench/packing.py``'s ``hf_trainer`` arm: the
largest fixed batch size within the token budget, rows grouped by length, the same steps and learning rate.

    .venv/bin/python bench/unsloth_arm.py --width 3072 --layers 4 --heads 24 --kv-heads 8 --intermediate 8192 \
        --budget 8192 --steps 20          # on a card with `pip install unsloth` (its wheels carried there)

Prints the arm's row as ``bench/packing.py`` does; last line ``ratio <unsloth tokens/s>`` (``gpu_suite.sh`` divides
voxrelay's packed tokens/s by it). Without CUDA or without the ``unsloth`` package it says so and exits 2.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _unsloth_or_exit():
    """Unsloth's ``FastLanguageModel`` (imported before transformers, as Unsloth requires)."""
    import torch

    if not torch.cuda.is_available() or importlib.util.find_spec("unsloth") is None:
        print("the Unsloth arm needs CUDA and `pip install unsloth` (its wheels carried to the card); skipped")
        sys.exit(2)
    from unsloth import FastLanguageModel

    return FastLanguageModel


def main() -> None:
    fast = _unsloth_or_exit()
    import torch

    from bench.packing import mfu, orpheus_set, trainer_arm, with_examples
    from voxrelay.models.orpheus.model import LORA_TARGETS

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for name, default in (("steps", 20), ("width", 3072), ("layers", 4), ("heads", 24), ("kv-heads", 8),
                          ("intermediate", 8192), ("budget", 8192), ("rows", 600)):
        ap.add_argument(f"--{name}", type=int, default=default)
    args = ap.parse_args()
    args.device, args.bf16, args.lora = "cuda", True, True
    with tempfile.TemporaryDirectory() as tmp:
        ds = with_examples(orpheus_set(tmp, args), args.steps)
        folder = Path(tmp) / "orpheus-width"
        ds.model.module.save_pretrained(str(folder))
        ds.model.tokenizer.save_pretrained(str(folder))
        net, _ = fast.from_pretrained(model_name=str(folder), max_seq_length=4096, dtype=torch.bfloat16,
                                      load_in_4bit=False)
        defaults = ds.model.lora_defaults()
        net = fast.get_peft_model(net, r=defaults.r, lora_alpha=defaults.alpha, lora_dropout=0.0, bias="none",
                                  target_modules=list(LORA_TARGETS), use_rslora=True,
                                  use_gradient_checkpointing="unsloth", random_state=0)
        ds.model.module = net
        torch.cuda.reset_peak_memory_stats()
        out = trainer_arm(ds, args, net.state_dict(), native=True)
    print(f"\n{ds.name}: {len(ds.rows)} rows, budget {ds.budget} tokens, {args.steps} steps, cuda, bf16, LoRA")
    print(f"{'arm':<15} {'padded':>8} {'audio-s/s':>10} {'tokens/s':>10} {'MFU':>6} {'max GiB':>8}")
    print(f"{'unsloth':<15} {'':>8} {out['audio_s_per_s']:>10.1f} {out['tokens_per_s']:>10.0f} "
          f"{mfu(ds, out['tokens_per_s'], True):>6.1%} {out['gib']:>8.2f}")
    print(f"ratio {out['tokens_per_s']:.1f}")


if __name__ == "__main__":
    main()
