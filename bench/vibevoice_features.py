"""What VibeVoice's features cost, stored as audio (``codec.type: pcm``, what voxrelay does) or as precomputed
σ-VAE latent means + semantic features (the alternative), side by side:

- disk and RAM per hour of audio: PCM measured (the Parquet shards of a generated dialogue corpus, zstd), the
  latents computed (64 + 128 values per latent, 7.5 latents per second, float16);
- encoder compute per second of audio at VibeVoice-1.5B's real sizes (FLOPs counted on the meta device) against
  the LM's training step over the same audio;
- the training step of a tiny model with its frozen encoders run on the audio (PCM) and with their outputs
  cached (what precomputed features would give), alternating, on this CPU.

    .venv/bin/python bench/vibevoice_features.py [--minutes 3] [--steps 8] [--repeats 3]

Last line: ratio = step time with encoding from audio / step time with precomputed features (tiny model).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parents[1]))  # tests.helpers: the tiny checkpoint, built offline

from tests.helpers.vibevoice import save_tiny_vibevoice  # noqa: E402

HOUR = 3600.0
LATENT_VALUES = 64 + 128  # acoustic mean + semantic features per latent


def shard_bytes_per_hour(minutes: float, workdir: Path) -> tuple[float, float, float]:
    """(Parquet bytes per hour, int16 bytes in RAM per hour, prepare seconds per hour) of PCM at 24 kHz."""
    from voxrelay.codecs.pcm import PcmCodec
    from voxrelay.data import shards as sh
    from voxrelay.data.audio import load_audio, resample
    from voxrelay.data.demo_corpus import generate_demo_corpus
    from voxrelay.data.sources import read_folder

    folder = generate_demo_corpus(workdir / "corpus", minutes=minutes, voices=["en-us", "en-gb+f3"], seed=0,
                                  layout="dialogues")
    codec, rows, started = PcmCodec(24000), [], time.perf_counter()
    for utt in read_folder(folder):
        wav, rate = load_audio(utt.audio_path)
        wav = resample(wav, rate, 24000)
        rows.append(sh.EncodedUtterance(utt.id, utt.text, utt.speaker, None, len(wav) / 24000,
                                        codec.encode(wav).astype(np.int16)))
    data = sh.encode_table(rows)
    seconds = time.perf_counter() - started
    hours = sum(r.duration for r in rows) / HOUR
    ram = sum(r.codes.nbytes for r in sh.decode_table(data, 1))
    return len(data) / hours, ram / hours, seconds / hours


def encoder_flops_per_second() -> dict[str, float]:
    """GFLOP per second of audio at VibeVoice-1.5B's sizes: each frozen encoder's forward, the LM's training step
    (6 x LM parameters per token; 4 x under LoRA, no weight gradients) at 7.5 tokens per second."""
    from torch.utils.flop_counter import FlopCounterMode

    from voxrelay.models.vibevoice.loading import meta_net

    net = meta_net("vibevoice/VibeVoice-1.5B-hf", "1.5B", 0.0)
    audio = torch.zeros(1, 1, 24000 * 10, device="meta")
    out = {}
    for name, part in (("acoustic", net.model.audio_tower.encoder), ("semantic", net.model.semantic_tokenizer_encoder)):
        with FlopCounterMode(display=False) as counter, torch.no_grad():
            part(audio)
        out[name] = counter.get_total_flops() / 10 / 1e9
    lm = sum(p.numel() for p in net.model.language_model.parameters())
    out["lm_full"], out["lm_lora"] = 6 * lm * 7.5 / 1e9, 4 * lm * 7.5 / 1e9
    return out


def step_times(checkpoint: Path, steps: int, repeats: int) -> tuple[list[float], list[float]]:
    """Seconds per training step of the tiny model: encoders run on the audio / their outputs cached."""
    from voxrelay.codecs.pcm import PcmCodec
    from voxrelay.data.shards import EncodedUtterance
    from voxrelay.models.base import DataSpec, pop_counts
    from voxrelay.models.registry import build_model
    from voxrelay.models.vibevoice.config import VibeVoiceFamilyConfig

    cfg = VibeVoiceFamilyConfig(init_from=str(checkpoint), max_length=2048, voice_prompt_drop_rate=0.0)
    model = build_model(cfg, DataSpec(1, 65536, [], 24000.0, 24000), seed=0)
    t = np.arange(24000 * 8) / 24000
    pcm = PcmCodec(24000)
    rows = [EncodedUtterance(f"r{i}", "[SPEAKER_A] Hello there.\n[SPEAKER_B] Hi, how are you doing today?",
                             "a,b" if i % 2 == 0 else "b,a", None, 8.0,
                             pcm.encode(0.3 * np.sin(2 * np.pi * (120 + 30 * i) * t)).astype(np.int16))
            for i in range(4)] + [EncodedUtterance(f"s{v}", "[SPEAKER_A] One.", v, None, 2.0,
                                                   pcm.encode(0.2 * np.sin(2 * np.pi * 200 * t[:48000]))
                                                   .astype(np.int16)) for v in "ab"]
    model.use_corpus(rows)
    batch = model.collate([model.example(r) for r in rows[:4]])
    pop_counts(batch)
    module, params = model.module, [p for p in model.module.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-4)
    encoder, semantic = module.net.model.audio_tower.encoder, module.net.model.semantic_tokenizer_encoder
    cache: dict = {}

    def cached(part, name):
        original = part.forward

        def forward(x, *args, **kwargs):
            key = (name, x.shape)
            if key not in cache:
                cache[key] = original(x, *args, **kwargs)
            return cache[key]
        return forward

    def timed(precomputed: bool) -> float:
        encoder.forward = cached(encoder, "a") if precomputed else type(encoder).forward.__get__(encoder)
        semantic.forward = cached(semantic, "s") if precomputed else type(semantic).forward.__get__(semantic)
        started = time.perf_counter()
        for _ in range(steps):
            terms = model.loss(module, batch)
            optimizer.zero_grad()
            sum(term.weight * term.sum / term.count for term in terms.values()).backward()
            optimizer.step()
        return (time.perf_counter() - started) / steps

    timed(True)  # warm-up (and fills the cache)
    audio_s, cached_s = [], []
    for _ in range(repeats):
        audio_s.append(timed(False))
        cached_s.append(timed(True))
    return audio_s, cached_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        disk, ram, prep = shard_bytes_per_hour(args.minutes, Path(tmp))
        latents = LATENT_VALUES * 7.5 * 2 * HOUR
        print(f"disk per hour: pcm {disk / 1e6:.1f} MB (Parquet, zstd) | latents {latents / 1e6:.1f} MB (float16)")
        print(f"RAM per hour per rank: pcm {ram / 1e6:.1f} MB | latents {latents / 1e6:.1f} MB")
        print(f"prepare per hour of audio on this CPU: pcm {prep:.0f} s (decode, resample, 16-bit); latents add the "
              "encoders' forward (below) once")
        flops = encoder_flops_per_second()
        print(f"VibeVoice-1.5B GFLOP per second of audio: acoustic encoder {flops['acoustic']:.1f}, semantic encoder "
              f"{flops['semantic']:.1f} (target clips only) | LM step {flops['lm_full']:.1f} full, "
              f"{flops['lm_lora']:.1f} LoRA")
        share = (flops["acoustic"] + flops["semantic"]) / flops["lm_lora"]
        print(f"encoding from audio at every step adds {100 * share:.0f}% to a LoRA step's FLOPs over the same audio")
        audio_s, cached_s = step_times(save_tiny_vibevoice(Path(tmp) / "tiny"), args.steps, args.repeats)
    a, c = statistics.median(audio_s), statistics.median(cached_s)
    print(f"tiny model step: from audio {a * 1000:.0f} ms, precomputed {c * 1000:.0f} ms (median of {args.repeats})")
    print(f"ratio {a / c:.3f}")


if __name__ == "__main__":
    main()
