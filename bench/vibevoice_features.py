"""What VibeVoice's features cost, stored as audio (``codec.type: pcm``, what voxrelay does, with the frozen
encoders' outputs cached per clip in memory at train time) or as precomputed σ-VAE latent means + semantic
features (the alternative), side by side:

- disk and RAM per hour of audio: PCM measured (the Parquet shards of a generated dialogue corpus, zstd), the
  latents as ``codec.type: vibevoice_latents`` stores them (float32 Parquet, measured per value on the tiny
  model's latents of the same clips, x 64 + 128 values per latent at 1.5B, 7.5 latents per second);
- the encoders' seconds per hour of audio at 1.5B sizes on this CPU (what a ``prepare`` of latents costs here);
- encoder compute per second of audio at VibeVoice-1.5B's real sizes (FLOPs counted on the meta device) against
  the LM's training step over the same audio;
- the training step of a tiny model with its frozen encoders run on the audio at every step
  (``model.feature_cache_gb=0``) and with the family's cache of their outputs (a step once its clips were seen:
  what precomputed features would give at every step), alternating, on this CPU.

    .venv/bin/python bench/vibevoice_features.py [--minutes 3] [--steps 8] [--repeats 3]

On CUDA (when available) also VibeVoice-1.5B's real sizes (random init) with LoRA in bf16 through voxrelay's own
training step: step time from audio vs with the cache, MFU, memory against ``voxrelay plan``.

Last line: ratio = step time encoding from audio / step time with the encoders' outputs cached (the 1.5B model
on CUDA when it ran, else the tiny one).
"""

from __future__ import annotations

import argparse
import dataclasses
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


def shard_bytes_per_hour(minutes: float, workdir: Path, latent_codec=None) -> tuple[float, float, float, float]:
    """(Parquet bytes per hour, int16 bytes in RAM per hour, prepare seconds per hour) of PCM at 24 kHz, and the
    Parquet bytes per hour per stored value of ``latent_codec``'s float32 latents of the same clips (0 without)."""
    from voxrelay.codecs.pcm import PcmCodec
    from voxrelay.data import shards as sh
    from voxrelay.data.audio import load_audio, resample
    from voxrelay.data.demo_corpus import generate_demo_corpus
    from voxrelay.data.sources import read_folder

    folder = generate_demo_corpus(workdir / "corpus", minutes=minutes, voices=["en-us", "en-gb+f3"], seed=0,
                                  layout="dialogues")
    codec, rows, wavs, started = PcmCodec(24000), [], [], time.perf_counter()
    for utt in read_folder(folder):
        wav, rate = load_audio(utt.audio_path)
        wav = resample(wav, rate, 24000)
        wavs.append(wav)
        rows.append(sh.EncodedUtterance(utt.id, utt.text, utt.speaker, None, len(wav) / 24000,
                                        codec.encode(wav).astype(np.int16)))
    data = sh.encode_table(rows)
    seconds = time.perf_counter() - started
    hours = sum(r.duration for r in rows) / HOUR
    ram = sum(r.codes.nbytes for r in sh.decode_table(data, 1))
    per_value = 0.0
    if latent_codec is not None:
        stored = [dataclasses.replace(r, codes=sh.stored_array(latent_codec.encode(w), latent_codec))
                  for r, w in zip(rows, wavs, strict=True)]
        per_value = len(sh.encode_table(stored)) / hours / latent_codec.num_codebooks
    return len(data) / hours, ram / hours, seconds / hours, per_value


def encode_seconds_per_hour(seconds: float = 10.0) -> dict[str, float]:
    """Seconds the frozen encoders at VibeVoice-1.5B's sizes (random init) take per hour of audio on this CPU
    (fp32, every thread torch uses): what ``prepare`` with ``codec.type: vibevoice_latents`` pays without a GPU."""
    from transformers import AutoModel, VibeVoiceConfig

    config = VibeVoiceConfig()
    audio = 0.05 * torch.randn(1, 1, int(24000 * seconds), generator=torch.Generator().manual_seed(0))
    out = {}
    for name, part in (("acoustic", AutoModel.from_config(config.audio_config).encoder),
                       ("semantic", AutoModel.from_config(config.semantic_model_config))):
        with torch.no_grad():
            part.eval()(audio[..., :24000])  # warm-up
            started = time.perf_counter()
            part(audio)
        out[name] = (time.perf_counter() - started) / seconds * HOUR
    return out


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
    from voxrelay.models.vibevoice.modeling import FeatureCache

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
    def timed(precomputed: bool) -> float:
        module.cache = FeatureCache(2**31 if precomputed else 0)  # the family's cache of the encoders' outputs
        terms = model.loss(module, batch)  # warm-up (and fills the cache)
        started = time.perf_counter()
        for _ in range(steps):
            terms = model.loss(module, batch)
            optimizer.zero_grad()
            sum(term.weight * term.sum / term.count for term in terms.values()).backward()
            optimizer.step()
        return (time.perf_counter() - started) / steps

    timed(True)
    audio_s, cached_s = [], []
    for _ in range(repeats):
        audio_s.append(timed(False))
        cached_s.append(timed(True))
    return audio_s, cached_s


def cuda_rows(target_s: float, prompt_s: float, steps: int, device: str = "cuda") -> dict[str, float]:
    """VibeVoice-1.5B's real sizes (random init: nothing to download) on the GPU, LoRA (the family's defaults),
    bf16 with fp32 master weights, one dialogue of ``target_s`` seconds with two voice prompts of ``prompt_s``
    through voxrelay's own build, LoRA, accelerate and ``train_step``: seconds per step from audio and with
    the encoders' outputs cached (precomputed), the step's FLOPs (counted) and MFU against the card's bf16
    peak, and ``max_memory_allocated`` against ``voxrelay plan``'s bytes for the same config and tokens."""
    from accelerate import Accelerator
    from transformers import VibeVoiceConfig, VibeVoiceForConditionalGeneration

    from tests.helpers.vibevoice import save_tokenizer
    from voxrelay.codecs.pcm import PcmCodec
    from voxrelay.config import load_config
    from voxrelay.data.shards import EncodedUtterance
    from voxrelay.models.vibevoice.loading import PRESETS, SETTINGS, assemble, freeze, load_tokenizer
    from voxrelay.models.vibevoice.modeling import FeatureCache
    from voxrelay.plan import Strategy, per_gpu
    from voxrelay.plan.model import model_facts
    from voxrelay.train.build import bare_run
    from voxrelay.train.loop import train_step

    cfg = load_config(None, ["model.family=vibevoice", "model.voice_prompt_drop_rate=0", "model.max_length=65536",
                             "train.precision=bf16", "train.lora=true", "train.max_steps=100"])
    with tempfile.TemporaryDirectory() as tmp:
        save_tokenizer(Path(tmp))
        tokenizer = load_tokenizer(tmp, "bench")
    ids = {"pad_token_id": 0, "eos_token_id": 0, "audio_bos_token_id": 1, "audio_eos_token_id": 2,
           "audio_token_id": 3}
    torch.manual_seed(0)
    with torch.device(device):
        net = VibeVoiceForConditionalGeneration(VibeVoiceConfig(**PRESETS["1.5B"], **ids))
    freeze(net)
    model = assemble(net, tokenizer, 0, cfg.model.max_length, 0.0, {k: getattr(cfg.model, k) for k in SETTINGS})
    rng, pcm = np.random.default_rng(0), PcmCodec(24000)

    def row(name: str, text: str, voices: str, seconds: float) -> EncodedUtterance:
        wav = 0.1 * rng.standard_normal(int(seconds * 24000))
        return EncodedUtterance(name, text, voices, None, seconds, pcm.encode(wav).astype(np.int16))

    turns = "".join(f"[SPEAKER_{'AB'[i % 2]}] Turn number {i} of a long conversation between two people.\n"
                    for i in range(int(target_s // 6)))
    rows = [row("dialogue", turns, "a,b", target_s), row("pa", "[SPEAKER_A] A prompt.", "a", prompt_s),
            row("pb", "[SPEAKER_A] B prompt.", "b", prompt_s)]
    model.use_corpus(rows)
    example = model.example(rows[0])
    accelerator = Accelerator(mixed_precision="bf16")
    run = bare_run(model, cfg, accelerator)
    batch = model.collate([example])
    inner = model.module.get_base_model() if hasattr(model.module, "get_base_model") else model.module

    def timed(cached: bool) -> float:
        inner.cache = FeatureCache(2**36 if cached else 0)  # the family's cache of the encoders' outputs
        train_step(run, [dict(batch, audio_seconds=1.0)])  # warm-up (and fills the cache)
        torch.cuda.synchronize()
        started = time.perf_counter()
        for _ in range(steps):
            train_step(run, [dict(batch, audio_seconds=1.0)])
        torch.cuda.synchronize()
        return (time.perf_counter() - started) / steps

    timed(False)
    torch.cuda.reset_peak_memory_stats()
    audio = timed(False)
    measured = torch.cuda.max_memory_allocated()
    cached = timed(True)
    tokens = int(batch["input_ids"].numel())
    lm = sum(p.numel() for p in inner.net.model.language_model.parameters())
    flops = 4 * lm * tokens  # a LoRA step's LM matmuls: forward 2N, backward 2N per token (attention left out)
    facts, _ = model_facts(cfg, None)
    predicted = per_gpu(facts, Strategy("ddp", 1, True, "adamw"), tokens, "autocast")
    return {"tokens": tokens, "audio_s": audio, "cached_s": cached, "flops": flops,
            "measured": measured, "plan": predicted["total"] - predicted["overhead"], "logits": predicted["logits"],
            "device": torch.cuda.get_device_name() if device == "cuda" else device}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cuda-target", type=float, default=900.0, help="CUDA: seconds of the dialogue")
    parser.add_argument("--cuda-prompt", type=float, default=120.0, help="CUDA: seconds of each voice prompt")
    parser.add_argument("--cuda-only", action="store_true", help="only the CUDA rows (no eSpeak corpus, no CPU step)")
    args = parser.parse_args()
    torch.manual_seed(0)
    if not args.cuda_only:
        a, c = cpu_rows(args)
    if torch.cuda.is_available():
        a, c = cuda_report(args)
    print(f"ratio {a / c:.3f}")


def cpu_rows(args) -> tuple[float, float]:
    from voxrelay.models.vibevoice.latent_codec import VibeVoiceLatentCodec

    with tempfile.TemporaryDirectory() as tmp:
        tiny = save_tiny_vibevoice(Path(tmp) / "tiny")
        disk, ram, prep, per_value = shard_bytes_per_hour(args.minutes, Path(tmp), VibeVoiceLatentCodec.load(str(tiny)))
        latents = LATENT_VALUES * 7.5 * 4 * HOUR
        print(f"disk per hour: pcm {disk / 1e6:.1f} MB (Parquet, zstd) | latents {per_value * LATENT_VALUES / 1e6:.1f} "
              f"MB (codec.type=vibevoice_latents: Parquet of float32, measured per value on the tiny model's, x "
              f"{LATENT_VALUES} values)")
        print(f"RAM per hour per rank: pcm {ram / 1e6:.1f} MB | latents {latents / 1e6:.1f} MB")
        encode = encode_seconds_per_hour()
        total = encode["acoustic"] + encode["semantic"]
        print(f"prepare per hour of audio on this CPU: pcm {prep:.0f} s (decode, resample, 16-bit); latents add the "
              f"encoders at 1.5B sizes: acoustic {encode['acoustic']:.0f} s + semantic {encode['semantic']:.0f} s = "
              f"{total:.0f} s (fp32, {torch.get_num_threads()} threads)")
        flops = encoder_flops_per_second()
        print(f"VibeVoice-1.5B GFLOP per second of audio: acoustic encoder {flops['acoustic']:.1f}, semantic encoder "
              f"{flops['semantic']:.1f} (target clips only) | LM step {flops['lm_full']:.1f} full, "
              f"{flops['lm_lora']:.1f} LoRA")
        share = (flops["acoustic"] + flops["semantic"]) / flops["lm_lora"]
        print(f"encoding from audio at every step adds {100 * share:.0f}% to a LoRA step's FLOPs over the same audio")
        audio_s, cached_s = step_times(tiny, args.steps, args.repeats)
    a, c = statistics.median(audio_s), statistics.median(cached_s)
    print(f"tiny model step: from audio {a * 1000:.0f} ms, precomputed {c * 1000:.0f} ms (median of {args.repeats})")
    return a, c


def cuda_report(args) -> tuple[float, float]:
    r = cuda_rows(args.cuda_target, args.cuda_prompt, args.steps)
    peak = 989e12  # H100/H200 SXM dense bf16
    print(f"{r['device']}: VibeVoice-1.5B LoRA bf16, one dialogue of {args.cuda_target:.0f} s + 2 prompts of "
          f"{args.cuda_prompt:.0f} s = {r['tokens']} tokens: step {r['audio_s']:.3f} s from audio, "
          f"{r['cached_s']:.3f} s precomputed ({r['audio_s'] / r['cached_s']:.2f}x); LM LoRA matmuls 4 x N x tokens = "
          f"{r['flops'] / 1e12:.1f} TFLOP per step: MFU {r['flops'] / r['audio_s'] / peak:.1%} from audio, "
          f"{r['flops'] / r['cached_s'] / peak:.1%} precomputed, of 989 TFLOP/s")
    print(f"memory: max_memory_allocated {r['measured'] / 1e9:.2f} GB, plan (ddp x1 lora, no overhead) "
          f"{r['plan'] / 1e9:.2f} GB of which logits {r['logits'] / 1e9:.2f} GB (an upper bound: VibeVoice's "
          f"logits cover the target span only): ratio {r['plan'] / r['measured']:.3f}")
    return r["audio_s"], r["cached_s"]


if __name__ == "__main__":
    main()
