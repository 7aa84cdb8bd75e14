"""Parler's training step: ours (the ``parler`` family's loss through its module: T5 description encoder, transcript
prepended, delay-pattern labels, one CE term per codebook) against transformers' stock ``MusicgenForCausalLM``
forward (the same decoder shape, cross-attention over the same description states, its own loss) on the same
batches, side by side in one process, alternating so machine noise hits both alike.

Musicgen is what transformers 5 has closest to Parler: it lacks the prepended transcript, Parler's delay
pattern (BOS 1025 / PAD = EOS 1024) and the rule that only the first EOS is a target, so the two losses are
not the same number (both are printed); the ratio compares the speed of a step over the same audio frames.
On a GPU (when one is there) ``--preset mini-v0.1 --bf16`` times the real shape and prints tokens/s and MFU
(6 x trained parameters x tokens per second / the GPU's bf16 peak); the preset's description encoder is a random
one of its size, saved locally, and the transcript tokenizer the tests' small one (no hub needed). Last line:
ratio = our tokens/s / Musicgen's.

    .venv/bin/python bench/parler_step.py [--steps 6] [--repeats 3] [--batch 4] [--frames 120] [--hidden 64]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parents[1]))  # tests.helpers: the tiny parts, built offline

from tests.helpers.parler import save_parts  # noqa: E402
from voxrelay.config import load_config  # noqa: E402
from voxrelay.models.base import DataSpec, pop_counts  # noqa: E402
from voxrelay.models.registry import build_model  # noqa: E402

BF16_PEAK = {"H100": 989e12, "H200": 989e12, "A100": 312e12}  # dense bf16 FLOP/s


def ours(args, parts: dict):
    overrides = ["model.family=parler", "model.dropout=0"]
    if args.preset == "tiny":
        overrides += ["model.preset=tiny", f"model.text_encoder={parts['text_encoder']}",
                      f"model.prompt_tokenizer={parts['prompt_tokenizer']}", f"model.hidden_size={args.hidden}",
                      f"model.num_layers={args.layers}", f"model.num_heads={max(2, args.hidden // 32)}",
                      f"model.ffn_dim={4 * args.hidden}"]
    else:  # the preset's shapes; its description encoder random and local (a card has no hub)
        overrides += [f"model.preset={args.preset}", f"model.text_encoder={parts['text_encoder']}",
                      f"model.prompt_tokenizer={parts['prompt_tokenizer']}"]
    return build_model(load_config(None, overrides).model, DataSpec(9, 1024), seed=0)


def preset_parts(preset: str, folder: Path) -> dict:
    """The tests' T5-style tokenizer and a random T5 encoder of ``preset``'s description encoder's size, saved in
    ``folder`` (no hub download: the frozen encoder's values do not change the step's cost)."""
    from transformers import AutoTokenizer, T5Config, T5EncoderModel

    from voxrelay.models.parler.config import KNOWN_T5, PRESETS

    tok = save_parts(folder)["prompt_tokenizer"]
    sizes = {k: v for k, v in KNOWN_T5[PRESETS[preset]["text_encoder"]].items() if k != "_name_or_path"}
    t5 = folder / "t5-preset"
    T5EncoderModel(T5Config(**sizes)).save_pretrained(str(t5))
    AutoTokenizer.from_pretrained(str(tok)).save_pretrained(str(t5))
    return {"text_encoder": t5, "prompt_tokenizer": tok}


def musicgen(model):
    """Musicgen's decoder of the same shape (K codebooks of V, width, layers, heads, FFN, positions)."""
    from transformers import MusicgenDecoderConfig, MusicgenForCausalLM

    dec = model.config.decoder
    cfg = MusicgenDecoderConfig(vocab_size=dec.vocab_size, num_codebooks=dec.num_codebooks,
                                hidden_size=dec.hidden_size, num_hidden_layers=dec.num_hidden_layers,
                                num_attention_heads=dec.num_attention_heads, ffn_dim=dec.ffn_dim,
                                max_position_embeddings=dec.max_position_embeddings, dropout=0.0,
                                pad_token_id=dec.eos_token_id, bos_token_id=dec.bos_token_id, audio_channels=1)
    torch.manual_seed(0)
    return MusicgenForCausalLM(cfg)


def batches(model, n: int, batch: int, frames: int) -> list[dict]:
    rng = np.random.default_rng(0)
    text, desc = "a sentence of about this many characters", "A calm female voice, very clear audio."
    rows = [[SimpleNamespace(id="x", text=text, speaker=None, description=desc,
                             codes=rng.integers(0, 1024, (9, frames))) for _ in range(batch)] for _ in range(n)]
    out = []
    for b in rows:
        collated = model.collate([model.example(r) for r in b])
        pop_counts(collated)
        out.append(collated)
    return out


def step_ours(model, opt, batch: dict) -> tuple[float, int]:
    terms = model.loss(model.module, batch)
    loss = sum(t.weight * t.sum / t.count for t in terms.values())
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return float(loss.detach()), int(batch["labels"].shape[0] * batch["labels"].shape[1])


def step_musicgen(model, mg, opt, batch: dict) -> tuple[float, int]:
    with torch.no_grad():  # the same frozen T5 description states
        cond = model.module.encode(batch["description_ids"], batch["description_mask"])
    labels = batch["labels"]  # [B, L, K]: Musicgen takes ids [B*K, L] and labels [B, L, K]
    ids = labels.clamp(min=0).transpose(1, 2).reshape(-1, labels.shape[1])
    out = mg(input_ids=ids, encoder_hidden_states=cond.encoder_states, encoder_attention_mask=cond.encoder_mask,
             labels=labels.masked_fill(labels < 0, -100))
    out.loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return float(out.loss), int(labels.shape[0] * labels.shape[1])


def timed(fn, data) -> tuple[float, float]:
    """(frames per second, last loss) over ``data``."""
    t0, frames, loss = time.perf_counter(), 0, float("nan")
    for batch in data:
        loss, n = fn(batch)
        frames += n
    return frames / (time.perf_counter() - t0), loss


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--frames", type=int, default=120)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--preset", default="tiny")
    p.add_argument("--bf16", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(torch.get_num_threads())
    folder = Path(tempfile.mkdtemp())
    parts = save_parts(folder) if args.preset == "tiny" else preset_parts(args.preset, folder)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = ours(args, parts)
    mg = musicgen(model)
    dtype = torch.bfloat16 if args.bf16 else torch.float32
    model.module.to(device, dtype)
    mg.to(device, dtype)
    data = [{k: v.to(device) for k, v in b.items()} for b in batches(model, args.steps, args.batch, args.frames)]
    opt_a = torch.optim.AdamW([q for q in model.module.parameters() if q.requires_grad], lr=1e-4)
    opt_b = torch.optim.AdamW(mg.parameters(), lr=1e-4)
    a_runs, b_runs = [], []
    for _ in range(args.repeats):
        a_runs.append(timed(lambda b: step_ours(model, opt_a, b), data))
        b_runs.append(timed(lambda b: step_musicgen(model, mg, opt_b, b), data))
    a, b = statistics.median(r[0] for r in a_runs), statistics.median(r[0] for r in b_runs)
    trained = sum(q.numel() for q in model.module.parameters() if q.requires_grad)
    print(f"device {device}, {'bf16' if args.bf16 else 'fp32'}, batch {args.batch} x {args.frames} frames, "
          f"decoder {model.config.decoder.hidden_size} x {model.config.decoder.num_hidden_layers}, "
          f"trained parameters {trained:,}")
    print(f"ours: {a:,.0f} frames/s (loss {a_runs[-1][1]:.3f}); musicgen stock: {b:,.0f} frames/s "
          f"(loss {b_runs[-1][1]:.3f}; another loss rule, not comparable)")
    if device == "cuda":
        name = torch.cuda.get_device_name()
        peak = next((v for k, v in BF16_PEAK.items() if k in name), None)
        if peak:
            print(f"MFU (ours, 6 x trained params x frames/s / {name} bf16 peak): {6 * trained * a / peak:.3f}")
    print(f"ratio {a / b:.3f}")


if __name__ == "__main__":
    main()
