"""How close ``voxrelay plan``'s formulas are to what torch really allocates.

CPU (always): small Llama decoders (the families' architecture) in pure bf16, autocast and fp32; predicted
activation bytes vs the bytes of the tensors autograd saves (``saved_tensors_hooks``, distinct storages,
parameters excluded), plus the family loss (logits' fp32 log-softmax) of a small codec_lm, and Parler-TTS
decoders (T5 cross-attention, GELU MLP, K codebooks) priced through the family's plan_shape. Then the plan's
total (the step's peak, without overhead) vs the peak of live tensor bytes of real training steps
(``tests/helpers/peak.py``: voxrelay's build, strategies and train_step on shapes nothing was fitted on), and
the plan beside the ``max_memory_allocated`` an H200 recorded (``tests/fixtures/plan/h200_max_allocated.json``).
CUDA (when available), one process per row, through voxrelay's own build, strategies (DDP/FSDP2, LoRA,
gradient checkpointing, 8-bit Adam, CPU offload) and train_step: Orpheus' family at Llama-3.2-3B's width
(hidden 3072, MLP 8192, 24/8 heads, vocab 156,940) with ``--layers`` layers, bf16, one micro-batch of
``--tokens`` tokens: ``voxrelay plan``'s bytes (its own code on the same config) without overhead vs
``torch.cuda.max_memory_allocated`` of the second step; beside it reserved/allocated (fragmentation), the
bytes outside torch's allocator (CUDA context, cuBLAS workspaces: the fixed overhead), where parameters and
optimizer states live (offload), and the loss' logits peak per vocabulary entry per token.

The last line is ``ratio <predicted/measured>``: the CUDA row farthest from 1 when CUDA ran, else the CPU
peak row farthest from 1.

    PYTHONPATH=src python bench/plan_accuracy.py [--tokens 2048] [--layers 4] [--only ddp,fsdp]
"""

from __future__ import annotations

import argparse
import contextlib
import os

import torch

from voxrelay.plan.formulas import LOGITS_PEAK_PER_VOCAB, activation_bytes, logits_bytes
from voxrelay.plan.model import shape_of

COMPUTE = {"bf16": (torch.bfloat16, contextlib.nullcontext),
           "autocast": (torch.float32, lambda: torch.autocast("cpu", dtype=torch.bfloat16)),
           "fp32": (torch.float32, contextlib.nullcontext)}


def llama(h: int, i: int, nh: int, kv: int, layers: int, vocab: int, dtype: torch.dtype, device: str = "cpu"):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=vocab, hidden_size=h, intermediate_size=i, num_hidden_layers=layers,
                         num_attention_heads=nh, num_key_value_heads=kv, tie_word_embeddings=True)
    with torch.device(device):
        return LlamaForCausalLM._from_config(config, attn_implementation="sdpa", dtype=dtype)


def saved_bytes(module: torch.nn.Module, fn) -> int:
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(n for ptr, n in seen.items() if ptr not in params)


def cpu_rows(tokens: int = 256) -> tuple[int, int]:
    total_pred = total_meas = 0
    for compute, (dtype, ctx) in COMPUTE.items():
        for h, i, nh, kv in [(256, 512, 4, 2), (512, 1536, 8, 2)]:
            module = llama(h, i, nh, kv, 4, 1000, dtype)
            ids = torch.randint(0, 1000, (1, tokens))
            with ctx():
                measured = saved_bytes(module, lambda m=module, x=ids: m.model(input_ids=x, use_cache=False))
            copies = sum(2 * m.weight.numel() for m in module.model.modules()
                         if isinstance(m, torch.nn.Linear)) if compute == "autocast" else 0
            predicted = activation_bytes(shape_of(module), tokens, compute, False, copies)
            print(f"cpu {compute:8s} h={h:4d} I={i:5d} layers=4 tokens={tokens}: predicted {predicted / 1e6:8.2f} MB "
                  f"measured {measured / 1e6:8.2f} MB  ratio {predicted / measured:.3f}")
            total_pred, total_meas = total_pred + predicted, total_meas + measured
    return total_pred, total_meas


def cpu_loss_row(tokens: int = 256) -> tuple[int, int]:
    """The codec_lm family's loss end to end (head + cross-entropy included), fp32."""
    from voxrelay.config import load_config
    from voxrelay.models.base import DataSpec
    from voxrelay.models.registry import build_model

    cfg = load_config(None, ["model.hidden_size=128", "model.num_layers=2", "model.num_heads=2",
                             "model.intermediate_size=384"])
    model = build_model(cfg.model, DataSpec(4, 256), 0)
    ids = torch.randint(0, 300, (2, tokens // 2))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}
    measured = saved_bytes(model.module, lambda: model.loss(model.module, batch))
    shape = shape_of(model.module)
    predicted = activation_bytes(shape, tokens, "fp32", False) + logits_bytes(shape.vocab, tokens - 2, peak=False)
    print(f"cpu codec_lm loss (vocab {shape.vocab}) tokens={tokens}: predicted {predicted / 1e6:.2f} MB measured "
          f"{measured / 1e6:.2f} MB  ratio {predicted / measured:.3f}")
    return predicted, measured


def cpu_parler_rows(tokens: int = 256, description: int = 32) -> tuple[int, int]:
    """Parler-TTS decoders (T5/Musicgen-like: cross-attention, GELU MLP, K codebooks), 4 layers, through the
    family's own plan_shape; shapes other than the four its cross layer was counted on."""
    from types import SimpleNamespace

    from voxrelay.models.parler.model import Parler
    from voxrelay.models.parler.modeling import build_parler
    from voxrelay.models.parler.plan import cross_description_bytes
    from voxrelay.models.parler.shapes import ParlerConfig, ParlerDecoderConfig

    t5 = dict(model_type="t5", vocab_size=64, d_model=48, d_kv=16, d_ff=64, num_layers=1, num_heads=2,
              feed_forward_proj="gated-gelu", dropout_rate=0.0)
    total_pred = total_meas = 0
    for compute in ("bf16", "fp32"):
        dtype, ctx = COMPUTE[compute]
        for h, ffn, nh, kv, k in [(448, 1792, 7, 7, 4), (512, 1024, 8, 4, 9)]:
            dec = ParlerDecoderConfig(vocab_size=72, num_codebooks=k, hidden_size=h, num_hidden_layers=4,
                                      num_attention_heads=nh, num_key_value_heads=kv, ffn_dim=ffn, dropout=0.0,
                                      num_cross_attention_key_value_heads=kv, max_position_embeddings=tokens + 8,
                                      eos_token_id=64, bos_token_id=65)
            module = build_parler(ParlerConfig(t5, dec, 40)).to(dtype)
            decoder = module.decoder.model["decoder"]
            ids, desc = torch.randint(0, 64, (1, tokens, k)), torch.randn(1, description, h, dtype=dtype)
            with ctx():
                measured = saved_bytes(module, lambda d=decoder, i=ids, e=desc: d(i, None, None, e, None))
            shape = Parler.plan_shape(SimpleNamespace(config=SimpleNamespace(decoder=dec), module=module))
            predicted = activation_bytes(shape, tokens, compute, False)
            with_desc = predicted + cross_description_bytes(shape, description, compute)
            print(f"cpu parler {compute:8s} h={h:4d} F={ffn:5d} kv={kv} K={k} tokens={tokens}: predicted "
                  f"{predicted / 1e6:8.2f} MB (+description {with_desc / 1e6:8.2f}) measured {measured / 1e6:8.2f} MB"
                  f"  ratio {predicted / measured:.3f} ({with_desc / measured:.3f})")
            total_pred, total_meas = total_pred + predicted, total_meas + measured
    return total_pred, total_meas


def cpu_peak_rows(tokenizer: str) -> float:
    """The plan's total (no overhead) vs the peak of live tensors over a real step; the worst ratio."""
    from tests.helpers.peak import CPU_ROWS, row_overrides, step_peak

    worst = 1.0
    for name, row in CPU_ROWS.items():
        measured, plan, n = step_peak(row_overrides(name, tokenizer), row[3])
        ratio = (plan["total"] - plan["overhead"]) / measured
        worst = ratio if abs(ratio - 1) > abs(worst - 1) else worst
        print(f"cpu peak {name:20s} tokens={n:4d}: plan {(plan['total'] - plan['overhead']) / 1e6:8.1f} MB (at "
              f"{plan['peak_phase']}) measured {measured / 1e6:8.1f} MB  ratio {ratio:.3f}", flush=True)
    return worst


def recorded_rows(tokenizer: str) -> None:
    """The plan beside what an H200 measured (no GPU needed: the plan's own code on the same configs)."""
    import json

    from tests.helpers.peak import H200, RECORDED_WITH, as_recorded, cached_through_backward, recorded_plan
    from voxrelay.config import load_config
    from voxrelay.plan.model import model_facts

    recorded = json.loads(H200.read_text())
    base = ["model.family=orpheus", f"model.tokenizer={tokenizer}", f"model.num_layers={recorded['layers']}",
            "train.precision=bf16", "train.max_steps=100", *RECORDED_WITH]  # the defaults they ran with
    facts = {lora: model_facts(load_config(None, [*base, *(as_recorded(["train.lora=true"]) if lora else [])]),
                               None)[0] for lora in (False, True)}
    held = recorded["held_out"]  # VibeVoice-1.5B LoRA: fitted on nothing
    rows = [(name, [*base, *as_recorded(row["overrides"])], recorded["tokens"], row["gb"],
             facts["train.lora=true" in row["overrides"]], row["overrides"]) for name, row in recorded["rows"].items()]
    rows.append((f"vibevoice-1.5B lora, {held['tokens']:,} tokens (held out)", [*held["overrides"], *RECORDED_WITH],
                 held["tokens"], held["gb"], None, []))
    for name, overrides, tokens, measured, shared, original in rows:
        plan = recorded_plan(overrides, tokens, shared)
        held_then = cached_through_backward(shared, original) if shared is not None else 0
        gb = (plan["total"] - plan["overhead"] + held_then) / 1e9
        print(f"h200 (recorded) {name:16s}: plan {gb:6.2f} GB (at {plan['peak_phase']}) | max_allocated "
              f"{measured:6.2f} GB, ratio {gb / measured:.3f}", flush=True)


# CUDA rows: name -> (config overrides, what plan calls the strategy); each runs in its own process (its own
# peak and process group) through voxrelay's own build, strategies and train_step, at Orpheus-3B's width
CUDA_ROWS: dict[str, tuple[list[str], dict]] = {
    "ddp": ([], {}),
    "ddp_gc": (["train.gradient_checkpointing=true"], {"gradient_checkpointing": True}),
    "ddp_8bit": (["train.optimizer=adamw_8bit"], {"optimizer": "adamw_8bit"}),
    "ddp_lora": (["train.lora=true"], {"lora": True}),
    "ddp_lora_gc": (["train.lora=true", "train.gradient_checkpointing=true"],
                    {"lora": True, "gradient_checkpointing": True}),
    "fsdp": (["train.strategy=fsdp"], {"strategy": "fsdp"}),
    "ddp_gc_8bit": (["train.gradient_checkpointing=true", "train.optimizer=adamw_8bit"],
                    {"gradient_checkpointing": True, "optimizer": "adamw_8bit"}),
    "fsdp_offload_gc": (["train.strategy=fsdp", "train.cpu_offload=true", "train.gradient_checkpointing=true"],
                        {"strategy": "fsdp", "cpu_offload": True, "gradient_checkpointing": True}),
    # the layer inputs in pinned host memory (not yet measured on a GPU; CPU: tests/helpers/peak.py's row)
    "ddp_lora_gc_act_offload": (["train.lora=true", "train.gradient_checkpointing=true",
                                 "train.activation_offload=true"],
                                {"lora": True, "gradient_checkpointing": True, "activation_offload": True}),
}
RESULT = "RESULT "


def cuda_worker(name: str, tokens: int, layers: int, tokenizer: str) -> dict:
    """One strategy: Orpheus' family at Llama-3.2-3B's width with ``layers`` layers (random init), bf16, one
    micro-batch of ``tokens`` tokens; the plan's bytes (same config, same code as ``voxrelay plan``) vs
    ``max_memory_allocated`` of the second step (the optimizer's states exist from the first)."""
    import numpy as np
    from accelerate import Accelerator

    from voxrelay.config import load_config
    from voxrelay.models.registry import build_model
    from voxrelay.plan import Strategy, compute_mode, per_gpu
    from voxrelay.plan.model import data_spec, model_facts
    from voxrelay.train.build import bare_run
    from voxrelay.train.loop import train_step
    from voxrelay.train.state import seed_everything

    overrides, kind = CUDA_ROWS[name]
    cfg = load_config(None, ["model.family=orpheus", f"model.tokenizer={tokenizer}", f"model.num_layers={layers}",
                             "train.precision=bf16", "train.max_steps=100", *overrides])
    accelerator = Accelerator(mixed_precision="bf16")
    seed_everything(0)
    model = build_model(cfg.model, data_spec(cfg, None), 0)
    run = bare_run(model, cfg, accelerator)
    module, optimizer = run.module, run.optimizer
    ids = np.random.default_rng(0).integers(128_266, 156_940, tokens)
    batch = model.collate([{"input_ids": ids, "labels": ids.copy()}])
    train_step(run, [dict(batch, audio_seconds=1.0)])
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    train_step(run, [dict(batch, audio_seconds=1.0)])
    torch.cuda.synchronize()
    measured, reserved = torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()
    free, total = torch.cuda.mem_get_info()  # read with the reserved bytes, at the same moment
    context = total - free - torch.cuda.memory_reserved()  # what torch's allocator does not see
    opt = getattr(optimizer, "optimizer", optimizer)
    where = {"params": sorted({p.device.type for p in module.parameters()}),
             "optimizer": sorted({v.device.type for s in opt.state.values() for v in s.values()
                                  if isinstance(v, torch.Tensor) and v.dim() > 0})}
    facts, _ = model_facts(cfg, None)
    st = Strategy(**{"strategy": "ddp", "gpus": 1, "lora": False, "optimizer": "adamw", **kind})
    predicted = per_gpu(facts, st, tokens, compute_mode(cfg, st.strategy))
    return {"name": name, "plan": st.name, "predicted": predicted, "measured": measured, "reserved": reserved,
            "context": context, "where": where}


def logits_peak(tokens: int, vocab: int = 156_940, hidden: int = 3072) -> float:
    """Bytes per vocabulary entry per token of the loss alone (bf16 head under autocast, fp32 cross-entropy,
    backward): what the plan's logits column prices at LOGITS_PEAK_PER_VOCAB (the head's bf16 weight gradient,
    2 x hidden / tokens per entry, is in this figure too)."""
    head = torch.nn.Linear(hidden, vocab, bias=False, device="cuda")
    x = torch.randn(tokens, hidden, device="cuda", requires_grad=True)
    target = torch.randint(0, vocab, (tokens,), device="cuda")
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = head(x)
    torch.nn.functional.cross_entropy(logits.float(), target).backward()
    torch.cuda.synchronize()
    grads = (x.numel() + head.weight.numel()) * 4  # the two fp32 gradients are not the logits' share
    return (torch.cuda.max_memory_allocated() - base - grads) / (tokens * vocab)


def cuda_rows(tokens: int, layers: int, only: list[str]) -> float:
    """Every CUDA strategy row, each in its own process; the worst predicted/measured ratio's distance from 1."""
    import json
    import os
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(root / "src"), str(root),
                                                                   os.environ.get("PYTHONPATH")) if p))
    print(f"cuda logits peak: {logits_peak(tokens):.2f} bytes per vocab entry per token (plan: "
          f"{LOGITS_PEAK_PER_VOCAB})", flush=True)
    worst = 1.0
    with tempfile.TemporaryDirectory() as tmp:
        sys.path.insert(0, str(root))
        from tests.helpers.orpheus import save_llama3_tokenizer

        tok = str(save_llama3_tokenizer(Path(tmp) / "tok"))
        for name in only:
            proc = subprocess.run([sys.executable, __file__, "--worker", name, f"--tokens={tokens}",
                                   f"--layers={layers}", f"--tokenizer={tok}"], env=env, capture_output=True,
                                  text=True)
            found = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT)]
            if not found:
                tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-8:])[-1200:]
                print(f"cuda {name}: failed (exit {proc.returncode}): {tail}", flush=True)
                continue
            r = json.loads(found[0][len(RESULT):])
            p = r["predicted"]
            no_overhead = p["total"] - p["overhead"]
            ratio = no_overhead / r["measured"]
            worst = ratio if abs(ratio - 1) > abs(worst - 1) else worst
            cols = " ".join(f"{k} {p[k] / 1e9:.2f}" for k in ("weights", "grads", "optimizer", "activations", "logits"))
            print(f"cuda {name:16s} ({r['plan']}): plan {no_overhead / 1e9:6.2f} GB ({cols}) | max_allocated "
                  f"{r['measured'] / 1e9:6.2f} GB, ratio {ratio:.3f} | reserved/allocated "
                  f"{r['reserved'] / r['measured']:.3f}, outside the allocator {r['context'] / 1e9:.2f} GB "
                  f"(plan's overhead {p['overhead'] / 1e9:.2f}) | lives on {r['where']}", flush=True)
    return worst


def cpu_sections() -> float:
    """The CPU rows: activations, the family loss, Parler, then the step peaks and the recorded H200 rows; the peak
    row farthest from 1."""
    pred, meas = cpu_rows()
    loss_pred, loss_meas = cpu_loss_row()
    parler_pred, parler_meas = cpu_parler_rows()
    total = (pred + loss_pred + parler_pred) / (meas + loss_meas + parler_meas)
    print(f"cpu activations total: predicted/measured {total:.3f}")
    import sys
    import tempfile
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.helpers.orpheus import save_llama3_tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        tok = str(save_llama3_tokenizer(Path(tmp) / "tok"))
        ratio = cpu_peak_rows(tok)
        recorded_rows(tok)
    return ratio


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2048, help="tokens of the CUDA micro-batch")
    parser.add_argument("--layers", type=int, default=4, help="decoder layers of the CUDA model")
    parser.add_argument("--only", default=",".join(CUDA_ROWS), help="CUDA rows: " + ", ".join(CUDA_ROWS))
    parser.add_argument("--cuda-only", action="store_true", help="skip the CPU rows (on a card: the CUDA rows only)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--tokenizer", help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # meta builds read config.json only: no hub at all
    torch.manual_seed(0)
    if args.worker:
        import json

        print(RESULT + json.dumps(cuda_worker(args.worker, args.tokens, args.layers, args.tokenizer)), flush=True)
        return
    ratio = float("nan")
    if not args.cuda_only:
        ratio = cpu_sections()
    if torch.cuda.is_available():
        ratio = cuda_rows(args.tokens, args.layers, [n for n in args.only.split(",") if n])
    else:
        print("cuda: not available, skipped")
    print(f"ratio {ratio:.3f}")


if __name__ == "__main__":
    main()
