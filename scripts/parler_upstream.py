#!/usr/bin/env python3
"""Compatibility fixture made with upstream Parler-TTS (huggingface/parler-tts 0.2.3).

Upstream pins transformers==4.46.1, so it cannot live in voxrelay's environment. This script keeps it in a
separate virtualenv: it creates that venv when it is missing, then re-executes itself inside it.

    python3 scripts/parler_upstream.py make-fixture [--venv DIR] [--out DIR] [--text-d-model N]
    python3 scripts/parler_upstream.py check-export FOLDER [--venv DIR] [--fixture DIR]
    (and make-checkpoint, make-dac, make-transformers-dac, make-peft-fields, check-adapter:
    scripts/parler_upstream_artifacts.py)

make-fixture: builds a tiny, seeded, random upstream ParlerTTSForConditionalGeneration and writes to
tests/fixtures/parler/ its config, its weights without the DAC (`audio_encoder.*`), the DAC key list, and the
inputs and outputs of one eval-mode forward with labels built like upstream's training script
(io.safetensors). The README.md it writes documents every tensor.

check-export: loads FOLDER (a checkpoint in upstream's format, e.g. written by our exporter) with upstream's
from_pretrained, runs the fixture inputs, and prints max |logit diff| and the losses against io.safetensors.
Exit status 1 when the logits differ by more than --atol.

Not part of the package install and not run by CI.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO_ROOT / "tests" / "fixtures" / "parler"
DEFAULT_VENV = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "voxrelay" / "parler-upstream-venv"
READY_MARKER = ".parler-upstream-ready"
VENV_VERSION = "2"  # bump when PIP_DEPS change: an older venv is topped up
STUB_DIR = "torchaudio-stub"

PIP_DEPS = [
    "torch==2.13.0",
    "transformers==4.46.1",
    "sentencepiece",
    "protobuf",
    "einops",
    "argbind",
    "flatten-dict",
    "julius",
    "soundfile",
    "ffmpy",
    "scipy",
    "importlib_resources",
    "rich",
    "tensorboard",
    "randomname",
    "accelerate==1.1.1",  # upstream's training launcher (checkpoint-* folders); 2024-11, beside transformers 4.46
    "peft==0.13.2",  # 2024-10: the peft of transformers 4.46's time, for PeftModel.from_pretrained checks
]
PIP_NO_DEPS = ["parler-tts==0.2.3", "descript-audio-codec==1.0.0", "descript-audiotools==0.7.2"]

SEED = 1234
PAD_ID, BOS_ID, NUM_CODEBOOKS, CODE_VOCAB = 1024, 1025, 9, 1088
PROMPT_VOCAB, TEXT_VOCAB = 80, 64
DECODER_HIDDEN = 16
DESC_LENS = (7, 5)  # description tokens per row; row 1 right-padded (T5 tokenizer default)
PROMPT_LENS = (6, 4)  # prompt tokens per row; row 1 left-padded (upstream's prompt_padding_side="left")
CODE_LENS = (8, 7)  # raw DAC frames per row; >= 7 or upstream's delay pattern is skipped (see README)
ATTN = "eager"


# ----------------------------------------------------------------------------- outer launcher


def ensure_venv(venv: Path) -> Path:
    """Create the upstream venv (pip installs as measured in FACTS.md) unless it is already complete."""
    python = venv / "bin" / "python"
    marker = venv / READY_MARKER
    if marker.exists() and marker.read_text().strip() == VENV_VERSION:
        return python
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, *PIP_DEPS], check=True)
    subprocess.run([*pip, "--no-deps", *PIP_NO_DEPS], check=True)
    stub = venv / STUB_DIR / "torchaudio"
    stub.mkdir(parents=True, exist_ok=True)
    (stub / "__init__.py").write_text(
        '"""Empty stand-in: descript-audiotools imports torchaudio at import time; Parler never calls it."""\n'
    )
    marker.write_text(VENV_VERSION + "\n")
    return python


def inside_venv(venv: Path) -> bool:
    return Path(sys.prefix).resolve() == venv.resolve()


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--venv", type=Path, default=DEFAULT_VENV, help=f"upstream venv (default {DEFAULT_VENV})")
    sub = parser.add_subparsers(dest="command", required=True)
    make = sub.add_parser("make-fixture", help="write the fixture folder")
    make.add_argument("--out", type=Path, default=DEFAULT_OUT)
    make.add_argument("--text-d-model", type=int, default=24, help="T5 d_model; equal to 16 -> no enc_to_dec_proj")
    make.add_argument("--keep-full", type=Path, help="also keep upstream's complete save (with the DAC, ~300 MB) here")
    check = sub.add_parser("check-export", help="run the fixture inputs through a checkpoint folder")
    check.add_argument("folder", type=Path)
    check.add_argument("--fixture", type=Path, default=DEFAULT_OUT)
    check.add_argument("--atol", type=float, default=1e-4)
    check.add_argument("--generate", type=Path, metavar="OURS", help="also run upstream's generate on FOLDER and "
                       "compare with the codes/audio voxrelay generated (scripts/parler_live_checks.py writes OURS)")
    ckpt = sub.add_parser("make-checkpoint", help="write an upstream output_dir with an accelerate checkpoint-* folder")
    dac = sub.add_parser("make-dac", help="write parler's DAC wrapper configs and codes of deterministic weights")
    tdac = sub.add_parser("make-transformers-dac", help="write a model whose audio encoder is transformers' DacModel")
    peft_fields = sub.add_parser("make-peft-fields", help="record the LoraConfig fields of the venv's peft")
    adapter = sub.add_parser("check-adapter", help="PeftModel.from_pretrained of an --adapter-only export")
    adapter.add_argument("folder", type=Path)
    adapter.add_argument("ours", type=Path, help="voxrelay's logits of the adapted model on the fixture's inputs")
    adapter.add_argument("--fixture", type=Path, default=DEFAULT_OUT)
    for p in (ckpt, dac, tdac, peft_fields):
        p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    for p in (make, check, ckpt, dac, tdac, adapter, peft_fields):
        p.add_argument("--venv", type=Path, default=argparse.SUPPRESS, help="upstream venv")
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    venv = args.venv.expanduser().absolute()
    if not inside_venv(venv):
        python = ensure_venv(venv)
        os.execv(str(python), [str(python), str(Path(__file__).resolve()), *argv])
    sys.path.insert(0, str(venv / STUB_DIR))
    quiet_upstream()
    import parler_upstream_artifacts as more

    if args.command == "make-fixture":
        make_fixture(args.out.absolute(), args.text_d_model, args.keep_full)
    elif args.command == "make-checkpoint":
        more.make_checkpoint(args.out.absolute())
    elif args.command == "make-dac":
        more.make_dac(args.out.absolute())
    elif args.command == "make-transformers-dac":
        more.make_transformers_dac(args.out.absolute())
    elif args.command == "make-peft-fields":
        more.make_peft_fields(args.out.absolute())
    elif args.command == "check-adapter":
        return more.check_adapter(args.folder.absolute(), args.ours.absolute(), args.fixture.absolute())
    else:
        status = check_export(args.folder.absolute(), args.fixture.absolute(), args.atol)
        if args.generate is not None:
            status = max(status, more.check_generate(args.folder.absolute(), args.generate.absolute()))
        return status
    return 0


def quiet_upstream() -> None:
    """Silence upstream's config-overwrite and deprecation chatter (inside the venv only)."""
    import logging
    import warnings

    import transformers

    transformers.logging.set_verbosity_error()
    logging.getLogger("parler_tts").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning)


# ----------------------------------------------------------------------------- model


def build_model(text_d_model: int, audio=None):
    """Tiny upstream model: flan-t5-like encoder, 9-codebook decoder, and ``audio`` as its audio encoder's config
    (default: parler's full-size DAC wrapper, not saved by make-fixture)."""
    import torch
    from parler_tts import DACConfig, ParlerTTSConfig, ParlerTTSDecoderConfig, ParlerTTSForConditionalGeneration
    from transformers import T5Config

    t5 = T5Config(
        vocab_size=TEXT_VOCAB,
        d_model=text_d_model,
        d_kv=8,
        d_ff=64,
        num_layers=2,
        num_heads=2,
        feed_forward_proj="gated-gelu",
        dropout_rate=0.0,
        tie_word_embeddings=False,
    )
    decoder = ParlerTTSDecoderConfig(
        vocab_size=CODE_VOCAB,
        max_position_embeddings=256,
        num_hidden_layers=2,
        ffn_dim=64,
        num_attention_heads=2,
        hidden_size=DECODER_HIDDEN,
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        layerdrop=0.0,
        pad_token_id=PAD_ID,
        eos_token_id=PAD_ID,
        bos_token_id=BOS_ID,
        num_codebooks=NUM_CODEBOOKS,
    )
    config = ParlerTTSConfig.from_sub_models_config(t5, audio or DACConfig(), decoder, vocab_size=PROMPT_VOCAB)
    config.pad_token_id = PAD_ID
    config.decoder_start_token_id = BOS_ID
    torch.manual_seed(SEED)
    model = ParlerTTSForConditionalGeneration._from_config(config, attn_implementation=ATTN)
    gen = model.generation_config
    gen.decoder_start_token_id, gen.bos_token_id, gen.pad_token_id, gen.eos_token_id = BOS_ID, BOS_ID, PAD_ID, PAD_ID
    randomize_weights(model)
    return model.eval()


def randomize_weights(model) -> None:
    """O(1)-scale random weights (upstream's init gives near-uniform logits, a weak check).

    Matrices ~ N(0, 1/fan_in), norm scales ~ 1 + N(0, 0.1), biases ~ N(0, 0.1). The sinusoidal
    `embed_positions.weights` and the DAC keep their upstream values.
    """
    import torch

    gen = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.startswith("audio_encoder.") or name.endswith("embed_positions.weights"):
                continue
            noise = torch.randn(param.shape, generator=gen)
            if param.ndim >= 2:
                param.copy_(noise / param.shape[-1] ** 0.5)
            elif name.endswith("bias"):
                param.copy_(0.1 * noise)
            else:
                param.copy_(1.0 + 0.1 * noise)


# ----------------------------------------------------------------------------- inputs, upstream's way


def padded_ids(lengths, vocab: int, side: str, gen):
    """Token ids ending in T5's </s> (1), padded with 0 on `side`; returns (ids, mask)."""
    import torch

    width = max(lengths)
    ids = torch.zeros(len(lengths), width, dtype=torch.long)
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for row, n in enumerate(lengths):
        tokens = torch.cat([torch.randint(2, vocab, (n - 1,), generator=gen), torch.tensor([1])])
        cols = slice(0, n) if side == "right" else slice(width - n, width)
        ids[row, cols], mask[row, cols] = tokens, 1
    return ids, mask


def upstream_labels(codes):
    """One sample's labels [K, n + K] from raw codes [K, n]: run_parler_tts_training.py postprocess_dataset."""
    import torch
    from parler_tts import build_delay_pattern_mask

    bos_labels = torch.ones((1, NUM_CODEBOOKS, 1)) * BOS_ID
    labels = torch.cat([bos_labels, codes.unsqueeze(0)], dim=-1)
    labels, delay_pattern_mask = build_delay_pattern_mask(
        labels,
        bos_token_id=BOS_ID,
        pad_token_id=PAD_ID,
        max_length=labels.shape[-1] + NUM_CODEBOOKS,
        num_codebooks=NUM_CODEBOOKS,
    )
    labels = torch.where(delay_pattern_mask == -1, PAD_ID, delay_pattern_mask)
    return labels[:, 1:]


def make_inputs(model) -> dict:
    """Deterministic batch of 2, collated like training/data.py DataCollatorParlerTTSWithPadding."""
    import torch
    from parler_tts.modeling_parler_tts import shift_tokens_right

    gen = torch.Generator().manual_seed(SEED + 1)
    input_ids, attention_mask = padded_ids(DESC_LENS, TEXT_VOCAB, "right", gen)
    prompt_ids, prompt_mask = padded_ids(PROMPT_LENS, PROMPT_VOCAB, "left", gen)
    codes = torch.full((len(CODE_LENS), NUM_CODEBOOKS, max(CODE_LENS)), -1, dtype=torch.long)
    for row, n in enumerate(CODE_LENS):
        codes[row, :, :n] = torch.randint(0, 1024, (NUM_CODEBOOKS, n), generator=gen)
    per_sample = [upstream_labels(codes[row, :, :n]).transpose(0, 1) for row, n in enumerate(CODE_LENS)]
    labels = torch.nn.utils.rnn.pad_sequence(per_sample, batch_first=True, padding_value=-100)
    config = model.config
    decoder_input_ids = shift_tokens_right(labels, config.pad_token_id, config.decoder_start_token_id).transpose(1, 2)
    targets = labels.masked_fill(labels == BOS_ID, -100)
    loss_mask = (decoder_input_ids.transpose(1, 2) != PAD_ID) & (targets != -100)
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "prompt_input_ids": prompt_ids,
        "prompt_attention_mask": prompt_mask,
        "audio_codes": codes,
        "audio_codes_lengths": torch.tensor(CODE_LENS, dtype=torch.long),
        "labels": labels.long(),
        "decoder_input_ids": decoder_input_ids.long().contiguous(),
        "loss_mask": loss_mask,
        # run_parler_tts_training.py's count: the OR of three `ne`s is always true -> B * T (padding included)
        "train_num_items_in_batch": (labels.ne(BOS_ID) | labels.ne(-100) | labels.ne(PAD_ID)).sum((0, 1))[0],
    }


MODEL_INPUTS = ("input_ids", "attention_mask", "prompt_input_ids", "prompt_attention_mask", "labels")


def run_forward(model, inputs: dict) -> dict:
    """Eval-mode fp32 forward with labels, mean and sum reductions; logits cut to the audio part [B, K, T, V]."""
    import torch

    kwargs = {name: inputs[name] for name in MODEL_INPUTS}
    with torch.no_grad():
        out = model(**kwargs, use_cache=False)
        out_sum = model(**kwargs, use_cache=False, loss_reduction="sum")
    batch, steps = inputs["labels"].shape[:2]
    full = out.logits.reshape(batch, NUM_CODEBOOKS, -1, out.logits.shape[-1])  # [B*K, Lp+T, V] -> [B, K, Lp+T, V]
    return {
        "logits": full[:, :, -steps:].contiguous(),
        "encoder_hidden_states": out.encoder_last_hidden_state.contiguous(),
        "loss": out.loss,
        "per_codebook_losses": torch.stack(out.per_codebook_losses),
        "loss_sum": out_sum.loss,
        "per_codebook_losses_sum": torch.stack(out_sum.per_codebook_losses),
        "returned_logits_shape": torch.tensor(out.logits.shape),
    }


# ----------------------------------------------------------------------------- writing the fixture


def make_fixture(out_dir: Path, text_d_model: int, keep_full: Path | None) -> None:
    from safetensors.torch import save_file

    model = build_model(text_d_model)
    inputs = make_inputs(model)
    outputs = run_forward(model, inputs)
    check_consistency(model, inputs, outputs)
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="parler-upstream-") as tmp:
        model.save_pretrained(tmp)
        for name in ("config.json", "generation_config.json"):
            shutil.copyfile(Path(tmp) / name, out_dir / name)
        keys = split_state_dict(Path(tmp) / "model.safetensors", out_dir)
        if keep_full is not None:
            shutil.copytree(tmp, keep_full, dirs_exist_ok=True)
    tensors = {**inputs, **outputs}
    save_file(tensors, str(out_dir / "io.safetensors"), metadata={"format": "pt"})
    write_readme(out_dir, model, tensors, keys)
    for path in sorted(out_dir.iterdir()):
        path.chmod(0o644)  # safetensors writes 0600
        print(f"{path.stat().st_size:>10}  {path}")
    print(f"loss {outputs['loss'].item():.6f}  logits {tuple(outputs['logits'].shape)}")


def check_consistency(model, inputs: dict, outputs: dict) -> None:
    """Guards on the recorded conventions: explicit decoder_input_ids and the loss recomputed by hand agree."""
    import torch

    kwargs = {name: inputs[name] for name in MODEL_INPUTS}
    with torch.no_grad():
        again = model(**kwargs, use_cache=False, decoder_input_ids=inputs["decoder_input_ids"])
    steps = inputs["labels"].shape[1]
    logits = again.logits.reshape(*outputs["logits"].shape[:2], -1, again.logits.shape[-1])[:, :, -steps:]
    assert torch.equal(logits, outputs["logits"]), "explicit decoder_input_ids changed the logits"
    mask, labels = inputs["loss_mask"], inputs["labels"]
    per_codebook = torch.stack(
        [
            torch.nn.functional.cross_entropy(outputs["logits"][:, k][mask[..., k]], labels[..., k][mask[..., k]])
            for k in range(NUM_CODEBOOKS)
        ]
    )
    torch.testing.assert_close(per_codebook, outputs["per_codebook_losses"])
    torch.testing.assert_close(per_codebook.mean(), outputs["loss"])


def split_state_dict(saved: Path, out_dir: Path) -> dict:
    """model.safetensors without `audio_encoder.*`; those keys go to audio_encoder_keys.json (shape, dtype)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    kept, dac = {}, {}
    with safe_open(str(saved), framework="pt") as f:
        for key in f.keys():
            if key.startswith("audio_encoder."):
                part = f.get_slice(key)
                dac[key] = {"shape": list(part.get_shape()), "dtype": part.get_dtype()}
            else:
                kept[key] = f.get_tensor(key).contiguous()
    save_file(kept, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    lines = [f"  {json.dumps(key)}: {json.dumps(dac[key])}" for key in sorted(dac)]
    (out_dir / "audio_encoder_keys.json").write_text("{\n" + ",\n".join(lines) + "\n}\n")
    return {"kept": sorted(kept), "audio_encoder": len(dac)}


# ----------------------------------------------------------------------------- README

TENSOR_DOCS = {
    "input_ids": "description token ids (T5 encoder input); row 1 right-padded with 0; each row ends in </s>=1",
    "attention_mask": "description mask, 1 = token, 0 = padding (right)",
    "prompt_input_ids": "transcript (prompt) ids for `embed_prompts`; row 1 LEFT-padded with 0",
    "prompt_attention_mask": "prompt mask, 1 = token, 0 = padding (left)",
    "audio_codes": "raw DAC codes [B, K, n] in [0, 1023], -1 beyond `audio_codes_lengths` (not a model input)",
    "audio_codes_lengths": "frames per row of `audio_codes`",
    "labels": "[B, T, K] delay-pattern labels, T = n + K; -100 pads the shorter row (collator layout)",
    "decoder_input_ids": "[B, K, T] = shift_tokens_right(labels, 1024, 1025).transpose(1, 2); -100 -> 1024",
    "loss_mask": "[B, T, K] positions that enter the loss: input != 1024 (EOS) and label not in {-100, 1025}",
    "train_num_items_in_batch": "the training script's loss normaliser: B * T (padding counted, see below)",
    "logits": "[B, K, T, V] decoder logits of the audio positions (prompt positions cut off)",
    "encoder_hidden_states": "[B, Ld, D] T5 output after enc_to_dec_proj, times attention_mask",
    "loss": "mean CE per codebook over loss_mask, averaged over the K codebooks (loss_reduction='mean')",
    "per_codebook_losses": "[K] the per-codebook mean CEs",
    "loss_sum": "loss_reduction='sum': (sum over codebooks of summed CE) / K",
    "per_codebook_losses_sum": "[K] summed CE per codebook",
    "returned_logits_shape": "shape of `outputs.logits` as upstream returns it: [B*K, Lp+T, V]",
}


def write_readme(out_dir: Path, model, tensors: dict, keys: dict) -> None:
    from importlib.metadata import version

    rows = "\n".join(
        f"| `{name}` | {list(t.shape)} | {str(t.dtype).removeprefix('torch.')} | {TENSOR_DOCS[name]} |"
        for name, t in tensors.items()
    )
    versions = ", ".join(
        f"{pkg} {version(pkg)}" for pkg in ("parler-tts", "transformers", "torch", "safetensors", "numpy")
    )
    text = README_TEMPLATE.format(
        versions=versions,
        python=sys.version.split()[0],
        rows=rows,
        loss=tensors["loss"].item(),
        n_keys=len(keys["kept"]),
        n_dac=keys["audio_encoder"],
        proj="yes" if hasattr(model, "enc_to_dec_proj") else "no",
        text_d_model=model.config.text_encoder.d_model,
        flags="" if model.config.text_encoder.d_model == 24 else f" --text-d-model {model.config.text_encoder.d_model}",
    )
    import parler_upstream_artifacts as more

    (out_dir / "README.md").write_text(text + more.README_MORE.format(accelerate=version("accelerate")))


README_TEMPLATE = """\
# Upstream Parler-TTS fixture (generated, do not edit)

Made by `python3 scripts/parler_upstream.py make-fixture{flags}` (repo root), which creates an isolated venv
with {versions} (Python {python}) and runs upstream's own code. Rerunning it reproduces these files (on another CPU the
logits differ by up to ~1.4e-6, the loss not at 6 digits).
Random weights, seed 1234, fp32, eval mode, `attn_implementation="eager"`; loss = {loss:.6f}.

## Model (`config.json`, `generation_config.json`: upstream `save_pretrained` output)

- T5 encoder (`text_encoder`): vocab 64, d_model {text_d_model}, d_kv 8, d_ff 64, 2 layers, 2 heads,
  gated-gelu. Decoder: hidden 16, 2 layers, 2 heads, ffn 64, 9 codebooks, vocab 1088, 256 sinusoidal
  positions, pad = eos = 1024, bos = decoder_start = 1025. Prompt vocab (`config.vocab_size`) 80.
  `enc_to_dec_proj` present: {proj}.
- Weights were drawn at O(1) scale (matrices N(0, 1/fan_in), norm scales 1 + N(0, 0.1), biases N(0, 0.1)) so
  logits are far from uniform. `decoder.model.decoder.embed_positions.weights` is upstream's sinusoid.
- `model.safetensors`: the {n_keys} saved tensors except `audio_encoder.*` (a full 44.1 kHz DAC, ~76M
  params, randomly initialised). As saved by upstream, the tied `text_encoder.encoder.embed_tokens.weight` is
  absent (only `text_encoder.shared.weight`). `audio_encoder_keys.json` lists the {n_dac} DAC keys with shape and
  dtype (weight norm as `...parametrizations.weight.original0/original1`).

## `io.safetensors` (B = 2, K = 9, T = 17, V = 1088, Ld = 7, Lp = 6, D = 16)

| name | shape | dtype | meaning |
|---|---|---|---|
{rows}

The forward call is `model(input_ids, attention_mask, prompt_input_ids, prompt_attention_mask, labels)`
(no decoder_attention_mask, as in training); decoder inputs are derived from `labels` by the model.

## Upstream conventions recorded here

- Labels (training `postprocess_dataset`): prepend a BOS column to codes [K, n], `build_delay_pattern_mask`
  with max_length n + 1 + K, fill the -1 slot with EOS, drop the first column. Row k of a sample:
  k x 1025, the n codes, one 1024 (EOS), then K-1-k x 1024. The collator transposes to [T, K] and pads with -100.
  Clips with n < 7 frames (max_length < 2K-1) skip the delay pattern: every label becomes 1024.
- Loss: labels equal to 1025 are ignored; a position whose *input* is 1024 is ignored, so only the first EOS
  of each codebook (and no padding) is a target. CE per codebook, then summed and divided by K.
- Training uses loss_reduction="sum" divided by `num_items_in_batch`, which upstream computes as
  `(l.ne(bos) | l.ne(-100) | l.ne(eos)).sum((0,1))[0]`: always B*T (here 34), not the target count.
- Decoder sequence = [prompt embeddings (Lp) ; summed codebook embeddings (T)]; sinusoidal positions 0..Lp+T-1
  over the concatenation (prompt padding counts), prompt mask prepended to an all-ones audio mask, causal.
  Returned logits are [B*K, Lp+T, V] (b-major); the loss uses the last T positions, stored here as [B, K, T, V].
- Because positions count the prompt's left padding, padding changes the audio logits: row 1 run alone
  without its 2 prompt pads differs by up to ~1.5 from its batched logits here. Description (right) padding
  has no effect (1.7e-6). A re-implementation must use column positions over [prompt ; audio].
- `embed_positions.weights` is a saved parameter but plain sinusoid: a checkpoint without it loads to the same
  logits (upstream reports it missing). `use_fused_lm_heads=True` stores one `decoder.lm_heads.weight`
  [K*V, D] = the K per-codebook heads concatenated along dim 0 (same logits). SDPA vs eager: 1.2e-6.

## Checking a checkpoint in upstream's format

`python3 scripts/parler_upstream.py check-export FOLDER` loads FOLDER with upstream's `from_pretrained`
(eager attention), runs these inputs and prints max |logit diff| and the losses (exit 1 if diff > 1e-4 or a
non-DAC key is missing). This folder itself passes (its DAC is then randomly initialised, unused here).
`--generate OURS` also runs upstream's README inference call and a greedy generation against voxrelay's
(see the live checks below).
"""


# ----------------------------------------------------------------------------- check-export


def check_export(folder: Path, fixture: Path, atol: float) -> int:
    import torch
    from parler_tts import ParlerTTSForConditionalGeneration
    from safetensors.torch import load_file

    model, info = ParlerTTSForConditionalGeneration.from_pretrained(
        str(folder), attn_implementation=ATTN, torch_dtype=torch.float32, output_loading_info=True
    )
    missing, unexpected, mismatched = info["missing_keys"], info["unexpected_keys"], info["mismatched_keys"]
    print(f"audio encoder: {type(model.audio_encoder).__name__} ({model.config.audio_encoder.model_type})")
    print(f"missing: {missing}\nunexpected: {unexpected}\nmismatched: {mismatched}")
    ref = load_file(str(fixture / "io.safetensors"))
    got = run_forward(model.eval(), ref)
    diff = (got["logits"] - ref["logits"]).abs()
    print(f"max |logit diff| {diff.max().item():.3e}  (per codebook {[f'{d:.1e}' for d in diff.amax((0, 2, 3))]})")
    print(f"loss {got['loss'].item():.6f} vs fixture {ref['loss'].item():.6f}")
    print(f"loss_sum {got['loss_sum'].item():.6f} vs fixture {ref['loss_sum'].item():.6f}")
    problems = [f"max |logit diff| > atol {atol}"] if diff.max().item() > atol else []
    if missing or unexpected or mismatched:
        problems.append("keys missing from the folder, unexpected or of other sizes")
    print("OK" if not problems else "MISMATCH: " + "; ".join(problems))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
