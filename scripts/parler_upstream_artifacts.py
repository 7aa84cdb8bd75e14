"""Upstream artifacts and checks beyond the model fixture, run INSIDE the upstream venv by
``scripts/parler_upstream.py`` (which builds the venv and dispatches here):

- ``make-checkpoint``: an upstream training ``output_dir`` with one ``checkpoint-1-epoch-0`` folder, written as
  ``training/run_parler_tts_training.py`` writes them (a real accelerate ``Accelerator``, one optimizer step,
  ``accelerator.save_state(..., safe_serialization=False)``; config, tokenizer and feature extractor saved
  once into ``output_dir``), for a smaller model, plus the inputs/outputs of its forward (``io.safetensors``);
- ``make-dac``: parler's own DAC wrapper (``DACModel(DACConfig())``, as ``push_dac_to_hub.py`` builds
  ``parler-tts/dac_44khZ_8kbps``) with deterministic weights: its ``config.json`` in both ``model_type``
  spellings and what it encodes/decodes for a fixed input;
- ``make-transformers-dac``: a model whose audio encoder is transformers' own ``DacModel`` (as mini v1.1 ships
  it) of the tests' tiny sizes: its config.json, its DAC tensors and what that DAC encodes and decodes;
- ``check_generate``/``check_adapter``: upstream's ``generate`` and peft's ``PeftModel.from_pretrained`` on
  folders written by voxrelay, against what voxrelay computed (``scripts/parler_live_checks.py``).
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

import parler_upstream as up

sys.path.insert(0, str(up.REPO_ROOT))  # tests.helpers.parler_dac / .parler: torch-only helpers shared with the tests

# the checkpoint's model: small enough for a fixture of a few hundred KB
CK_CODEBOOKS, CK_CODES = 4, 32  # 4 codebooks of 32 codes: vocab 40, eos = pad = 32, bos = 33
CK_PAD, CK_BOS, CK_VOCAB = 32, 33, 40
CK_STEP, CK_EPOCH = 1, 0
CK_CODE_LENS = (8, 7)
TINY_DESCRIPT = dict(encoder_dim=2, encoder_rates=[2, 2], decoder_dim=4, decoder_rates=[2, 2],
                     n_codebooks=CK_CODEBOOKS, codebook_size=CK_CODES, codebook_dim=4)


# ----------------------------------------------------------------------------- make-checkpoint


def build_checkpoint_model(vocab: int):
    """Upstream model for the checkpoint: T5 (d_model 24, 1 layer), decoder hidden 16 x 2 layers, 4 codebooks of 32
    codes; its 76M DAC swapped for a tiny descript ``DAC`` re-normed as ``DACModel.__init__`` does."""
    import torch
    from dac.model import DAC
    from parler_tts import DACConfig, ParlerTTSConfig, ParlerTTSDecoderConfig, ParlerTTSForConditionalGeneration
    from transformers import T5Config

    t5 = T5Config(vocab_size=vocab, d_model=24, d_kv=8, d_ff=32, num_layers=1, num_heads=2,
                  feed_forward_proj="gated-gelu", dropout_rate=0.0, tie_word_embeddings=False)
    decoder = ParlerTTSDecoderConfig(
        vocab_size=CK_VOCAB, max_position_embeddings=64, num_hidden_layers=2, ffn_dim=32, num_attention_heads=2,
        hidden_size=16, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, layerdrop=0.0,
        pad_token_id=CK_PAD, eos_token_id=CK_PAD, bos_token_id=CK_BOS, num_codebooks=CK_CODEBOOKS)
    dac_config = DACConfig(num_codebooks=CK_CODEBOOKS, codebook_size=CK_CODES, latent_dim=8)
    config = ParlerTTSConfig.from_sub_models_config(t5, dac_config, decoder, vocab_size=vocab)
    config.pad_token_id, config.decoder_start_token_id = CK_PAD, CK_BOS
    torch.manual_seed(up.SEED)
    model = ParlerTTSForConditionalGeneration._from_config(config, attn_implementation=up.ATTN)
    gen = model.generation_config
    gen.decoder_start_token_id, gen.bos_token_id, gen.pad_token_id, gen.eos_token_id = CK_BOS, CK_BOS, CK_PAD, CK_PAD
    model.audio_encoder.model = DAC(**TINY_DESCRIPT)
    model.audio_encoder.remove_weight_norm()
    model.audio_encoder.apply_weight_norm()
    up.randomize_weights(model)
    return model


def checkpoint_inputs(vocab: int) -> dict:
    """A batch of 2 collated as upstream's training collator does (labels from build_delay_pattern_mask)."""
    import torch
    from parler_tts import build_delay_pattern_mask

    gen = torch.Generator().manual_seed(up.SEED + 2)
    input_ids, attention_mask = up.padded_ids((6, 4), vocab, "right", gen)
    prompt_ids, prompt_mask = up.padded_ids((5, 3), vocab, "left", gen)
    per_sample = []
    for n in CK_CODE_LENS:
        codes = torch.randint(0, CK_CODES, (1, CK_CODEBOOKS, n), generator=gen)
        labels = torch.cat([torch.full((1, CK_CODEBOOKS, 1), CK_BOS), codes], dim=-1)
        labels, mask = build_delay_pattern_mask(labels, bos_token_id=CK_BOS, pad_token_id=CK_PAD,
                                                max_length=labels.shape[-1] + CK_CODEBOOKS, num_codebooks=CK_CODEBOOKS)
        per_sample.append(torch.where(mask == -1, CK_PAD, mask)[:, 1:].transpose(0, 1))
    labels = torch.nn.utils.rnn.pad_sequence(per_sample, batch_first=True, padding_value=-100).long()
    return {"input_ids": input_ids, "attention_mask": attention_mask, "prompt_input_ids": prompt_ids,
            "prompt_attention_mask": prompt_mask, "labels": labels}


def train_one_step(accelerator, model, optimizer, scheduler, batch: dict) -> float:
    """run_parler_tts_training.py's update: loss_reduction="sum" over its num_items_in_batch, clip, step."""
    labels = batch["labels"]
    num_items = (labels.ne(CK_BOS) | labels.ne(-100) | labels.ne(CK_PAD)).sum((0, 1))[0]
    model.train()
    loss = model(**batch, loss_reduction="sum").loss / num_items
    accelerator.backward(loss)
    accelerator.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()
    return float(loss)


def make_checkpoint(out_dir: Path) -> None:
    from datetime import timedelta

    import torch
    from accelerate import Accelerator
    from accelerate.utils import DistributedDataParallelKwargs, InitProcessGroupKwargs
    from safetensors.torch import save_file
    from transformers import AutoTokenizer, EncodecFeatureExtractor, get_scheduler

    from tests.helpers.parler import save_t5_tokenizer

    output_dir = out_dir / "output_dir_training"
    shutil.rmtree(output_dir, ignore_errors=True)
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = AutoTokenizer.from_pretrained(str(save_t5_tokenizer(Path(tmp))), padding_side="left")
    model = build_checkpoint_model(len(tokenizer))
    model.freeze_encoders(True)  # seed 000: freeze_text_encoder true (the DAC is always frozen)
    handlers = [InitProcessGroupKwargs(timeout=timedelta(minutes=120)),
                DistributedDataParallelKwargs(find_unused_parameters=False)]
    accelerator = Accelerator(gradient_accumulation_steps=1, mixed_precision="no", project_dir=str(output_dir),
                              kwargs_handlers=handlers)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.01)
    scheduler = get_scheduler("constant_with_warmup", optimizer=optimizer, num_warmup_steps=1, num_training_steps=2)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    output_dir.mkdir(parents=True)
    tokenizer.save_pretrained(str(output_dir))  # as the script: prompt tokenizer, feature extractor, config
    EncodecFeatureExtractor(sampling_rate=44100).save_pretrained(str(output_dir))
    accelerator.unwrap_model(model).config.save_pretrained(str(output_dir))
    batch = checkpoint_inputs(len(tokenizer))
    train_loss = train_one_step(accelerator, model, optimizer, scheduler, batch)
    checkpoint = output_dir / f"checkpoint-{CK_STEP}-epoch-{CK_EPOCH}"
    accelerator.save_state(output_dir=str(checkpoint), safe_serialization=False)
    unwrapped = accelerator.unwrap_model(model).eval()
    with torch.no_grad():
        out = unwrapped(**batch, use_cache=False)
    steps = batch["labels"].shape[1]
    logits = out.logits.reshape(2, CK_CODEBOOKS, -1, CK_VOCAB)[:, :, -steps:].contiguous()
    io = {**batch, "logits": logits, "loss": out.loss, "per_codebook_losses": torch.stack(out.per_codebook_losses),
          "train_loss": torch.tensor(train_loss)}
    save_file(io, str(out_dir / "checkpoint_io.safetensors"), metadata={"format": "pt"})
    files = sorted(p.relative_to(out_dir) for p in output_dir.rglob("*") if p.is_file())
    for path in files:
        (out_dir / path).chmod(0o644)
        print(f"{(out_dir / path).stat().st_size:>9}  {path}")
    print(f"train loss {train_loss:.6f}; eval loss {out.loss.item():.6f}; logits {tuple(logits.shape)}")


# ----------------------------------------------------------------------------- make-dac


def make_dac(out_dir: Path) -> None:
    """parler's DACModel(DACConfig()) with :func:`tests.helpers.parler_dac.dac_state` weights: config.json in both
    spellings (transformers <= 4.44.2dev registers DACConfig as "dac", later as "dac_on_the_hub"), the key list
    checked against audio_encoder_keys.json, and encoder latents / codes / decoded audio of a fixed signal."""
    import torch
    from parler_tts import DACConfig, DACModel
    from safetensors.torch import load_file, save_file

    from tests.helpers.parler_dac import dac_state, fixed_signal

    model = DACModel(DACConfig())  # helpers/push_to_hub_scripts/push_dac_to_hub.py
    shapes = {k: list(v.shape) for k, v in model.state_dict().items()}
    model.load_state_dict(dac_state(shapes))
    model.eval()
    recorded = json.loads((out_dir / "audio_encoder_keys.json").read_text())
    assert {"audio_encoder." + k: v for k, v in shapes.items()} == {k: v["shape"] for k, v in recorded.items()}
    dac_dir = out_dir / "dac"
    dac_dir.mkdir(exist_ok=True)
    spelling = DACConfig.model_type
    try:
        for model_type in ("dac_on_the_hub", "dac"):
            DACConfig.model_type = model_type  # the class attribute each transformers range gives it
            with tempfile.TemporaryDirectory() as tmp:
                model.save_pretrained(tmp)
                saved = load_file(str(Path(tmp) / "model.safetensors"))
                assert sorted(p.name for p in Path(tmp).iterdir()) == ["config.json", "model.safetensors"]
                assert all(torch.equal(saved[k], v) for k, v in dac_state(shapes).items()) and len(saved) == len(shapes)
                shutil.copyfile(Path(tmp) / "config.json", dac_dir / f"config.{model_type}.json")
    finally:
        DACConfig.model_type = spelling
    x = fixed_signal()
    with torch.no_grad():
        codes = model.encode(x, sample_rate=44100).audio_codes  # [chunks 1, B 1, K, T]
        latents = model.model.encoder(model.model.preprocess(x, 44100))
        audio = model.decode(codes, [None]).audio_values
    io = {"input_values": x, "latents": latents.contiguous(), "audio_codes": codes[0, 0].contiguous(),
          "audio_values": audio.contiguous()}
    save_file(io, str(dac_dir / "io.safetensors"), metadata={"format": "pt"})
    for path in sorted(dac_dir.iterdir()):
        path.chmod(0o644)
        print(f"{path.stat().st_size:>9}  {path}")
    print(f"codes {tuple(io['audio_codes'].shape)}: {io['audio_codes'][:, :4].tolist()}")


def make_transformers_dac(out_dir: Path) -> None:
    """A model whose audio encoder is transformers' own DacModel (``model_type`` "dac", as parler-tts-mini-v1.1
    ships its DAC) of the tests' tiny sizes (tests/helpers/parler.py ``TINY_DAC``), saved by upstream's
    ``save_pretrained``: its config.json, the ``audio_encoder.*`` tensors of its model.safetensors (the rest is
    the main fixture's), and what that DAC encodes for a fixed signal and decodes from those codes."""
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import DacConfig

    from tests.helpers.parler import TINY_DAC
    from tests.helpers.parler_dac import fixed_signal

    model = up.build_model(24, DacConfig(**TINY_DAC))
    dac = model.audio_encoder.eval()
    gen = torch.Generator().manual_seed(up.SEED)
    with torch.no_grad():  # O(1) signals (the DAC's own init decodes to ~1e-3)
        for name, param in dac.named_parameters():
            noise = torch.randn(param.shape, generator=gen)
            if name.endswith(".alpha"):
                param.copy_(1.0 + 0.1 * noise)
            elif name.endswith(".bias"):
                param.copy_(0.01 * noise)
            else:
                fan_in = param[0].numel() ** 0.5  # the decoder's smaller: its final tanh would saturate
                scale = 1.0 if "codebook" in name else (0.6 if name.startswith("decoder.") else 1.0) / fan_in
                param.copy_(noise * scale)
    assert type(dac).__name__ == "DacModel" and dac.config.hidden_size == TINY_DAC["hidden_size"]
    folder = out_dir / "transformers_dac"
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        saved = load_file(str(Path(tmp) / "model.safetensors"))
        shutil.copyfile(Path(tmp) / "config.json", folder / "config.json")
    audio_encoder = {k: v.contiguous() for k, v in saved.items() if k.startswith("audio_encoder.")}
    assert audio_encoder.keys() == {"audio_encoder." + k for k in dac.state_dict()}
    save_file(audio_encoder, str(folder / "model.safetensors"), metadata={"format": "pt"})
    x = fixed_signal()
    with torch.no_grad():
        codes = dac.encode(x).audio_codes  # [B 1, K, T]
        audio = dac.decode(audio_codes=codes).audio_values  # [B 1, samples]
    io = {"input_values": x, "audio_codes": codes[0].contiguous(), "audio_values": audio.contiguous()}
    save_file(io, str(folder / "io.safetensors"), metadata={"format": "pt"})
    for path in sorted(folder.iterdir()):
        path.chmod(0o644)
        print(f"{path.stat().st_size:>9}  {path}")
    print(f"{len(audio_encoder)} audio_encoder tensors; codes {tuple(io['audio_codes'].shape)}; audio "
          f"{tuple(audio.shape)}, max |x| {audio.abs().max().item():.4f}, std {audio.std().item():.4f}")


# ----------------------------------------------------------------------------- checks of voxrelay's exports


def check_generate(folder: Path, ours_file: Path) -> int:
    """Upstream README's inference call on FOLDER, then greedy generation compared with voxrelay's (same ids,
    max_length, min_new_tokens): the codes upstream's generate hands its DAC, and the audio."""
    import torch
    from parler_tts import ParlerTTSForConditionalGeneration
    from safetensors.torch import load_file

    ours = load_file(str(ours_file))
    model = ParlerTTSForConditionalGeneration.from_pretrained(str(folder), attn_implementation=up.ATTN,
                                                              torch_dtype=torch.float32).eval()
    ids, prompt = ours["input_ids"], ours["prompt_input_ids"]
    print(f"generation_config: {json.dumps(model.generation_config.to_diff_dict(), sort_keys=True)}")
    # README's call (sampling), shorter; a random model also samples the 62 ids that are no DAC code (1026-1087),
    # which upstream's decode cannot take (a trained one does not): banned here
    unused = list(range(model.config.decoder.bos_token_id + 1, model.config.decoder.vocab_size))
    torch.manual_seed(0)
    readme = model.generate(input_ids=ids, prompt_input_ids=prompt, max_length=64, suppress_tokens=unused)
    print(f"README call model.generate(input_ids=..., prompt_input_ids=..., max_length=64, suppress_tokens=[1026..]): "
          f"audio {tuple(readme.shape)}, finite {bool(torch.isfinite(readme).all())}")
    seen = []
    decode = model.audio_encoder.decode

    def spy(*args, audio_codes, **kwargs):  # upstream passes codes by name (DacModel's first is latents)
        seen.append(audio_codes.detach().clone())
        return decode(*args, audio_codes=audio_codes, **kwargs)

    model.audio_encoder.decode = spy
    audio = model.generate(input_ids=ids, prompt_input_ids=prompt, do_sample=False, suppress_tokens=unused,
                           max_length=int(ours["max_length"]), min_new_tokens=int(ours["min_new_tokens"]))
    codes = seen[-1].reshape(model.decoder.num_codebooks, -1)
    same = codes.shape == ours["codes"].shape and torch.equal(codes, ours["codes"])
    diff = (audio.reshape(-1) - ours["audio"]).abs().max().item() if audio.numel() == ours["audio"].numel() else None
    print(f"greedy: upstream codes {tuple(codes.shape)}, voxrelay's {tuple(ours['codes'].shape)}, equal {same}; "
          f"audio {audio.numel()} samples, max |diff| vs voxrelay's {diff}")
    ok = same and diff is not None and diff < 1e-4
    print("GENERATE OK" if ok else "GENERATE MISMATCH")
    return 0 if ok else 1


def check_adapter(folder: Path, ours_file: Path, fixture: Path) -> int:
    """peft's PeftModel.from_pretrained (and AutoPeftModel, through the adapter's auto_mapping and base name) of
    voxrelay's --adapter-only export on upstream's model of the fixture: its logits against voxrelay's."""
    import peft
    import torch
    from parler_tts import ParlerTTSForConditionalGeneration
    from safetensors.torch import load_file

    io, ours = load_file(str(fixture / "io.safetensors")), load_file(str(ours_file))
    base = ParlerTTSForConditionalGeneration.from_pretrained(str(fixture), attn_implementation=up.ATTN,
                                                             torch_dtype=torch.float32).eval()
    plain = up.run_forward(base, io)["logits"]
    model = peft.PeftModel.from_pretrained(base, str(folder)).eval()
    got = up.run_forward(model, io)["logits"]
    auto = peft.AutoPeftModel.from_pretrained(str(folder), attn_implementation=up.ATTN, torch_dtype=torch.float32)
    got_auto = up.run_forward(auto.eval(), io)["logits"]
    d_ours, d_auto = (got - ours["logits"]).abs().max().item(), (got_auto - ours["logits"]).abs().max().item()
    d_base = (got - plain).abs().max().item()
    print(f"peft {peft.__version__}: PeftModel.from_pretrained({type(base).__name__}) max |logit diff| vs voxrelay "
          f"{d_ours:.3e}; AutoPeftModel ({type(auto.get_base_model()).__name__}) {d_auto:.3e}; the adapter moves "
          f"the base's logits by {d_base:.3e}")
    ok = d_ours < 1e-4 and d_auto < 1e-4 and d_base > 1e-2
    print("ADAPTER OK" if ok else "ADAPTER MISMATCH")
    return 0 if ok else 1


def make_peft_fields(out_dir: Path) -> None:
    """The fields peft's LoraConfig takes in this venv (peft of upstream's time): an adapter_config.json with any
    other key is refused there (``LoraConfig.__init__() got an unexpected keyword argument``)."""
    import dataclasses

    import peft

    names = sorted(f.name for f in dataclasses.fields(peft.LoraConfig))
    path = out_dir / f"peft_{peft.__version__}_lora_config_fields.json"
    path.write_text(json.dumps({"peft": peft.__version__, "fields": names}, indent=1) + "\n")
    print(f"{len(names)} fields -> {path}")


README_MORE = """
## `output_dir_training/` and `checkpoint_io.safetensors` (`make-checkpoint`)

Upstream's training `output_dir` as `training/run_parler_tts_training.py` leaves it after one optimizer step
(`save_steps` 1): a real accelerate {accelerate} `Accelerator` (no mixed precision, the script's kwargs handlers)
prepared the model, AdamW and a constant_with_warmup schedule; one training step as the script takes it
(loss_reduction="sum" / its num_items_in_batch, clip 1.0, step); then
`accelerator.save_state(output_dir/checkpoint-1-epoch-0, safe_serialization=False)`: `pytorch_model.bin`
(pickled), `optimizer.bin`, `scheduler.bin`, `random_states_0.pkl`, no config.json. Into `output_dir` itself,
as the script does once: the prompt tokenizer (a tiny T5-style Unigram tokenizer of 150 pieces,
tests/helpers/parler.py), the feature extractor (EncodecFeatureExtractor, 44.1 kHz) and `config.json`.
To stay small the model is smaller than the one above (T5 d_model 24 x 1 layer; decoder hidden 16 x 2 layers,
4 codebooks of 32 codes: vocab 40, eos = pad = 32, bos = 33; text encoder and DAC frozen, as seed 000) and
its 76M DAC is swapped, before `prepare`, for a tiny descript `DAC(encoder_dim=2, encoder_rates=[2, 2],
decoder_dim=4, decoder_rates=[2, 2], n_codebooks=4, codebook_size=32, codebook_dim=4)` re-normed as
`DACModel.__init__` does (descript names, `parametrizations.weight.original0/1`); config.json still describes
DACConfig's default architecture, so upstream's own `load_state` needs the same swap.
`checkpoint_io.safetensors`: the step's batch (`input_ids`, `attention_mask`, `prompt_input_ids`,
`prompt_attention_mask`, `labels` [B, T, K]), then eval-mode `logits` [B, K, T, V] of the saved weights,
`loss`, `per_codebook_losses`, and the training step's `train_loss`.

## `dac/` (`make-dac`)

Parler's own DAC wrapper, built as `helpers/push_to_hub_scripts/push_dac_to_hub.py` builds
`parler-tts/dac_44khZ_8kbps`: `DACModel(DACConfig())`, with weights from tests/helpers/parler_dac.py (each tensor
a seeded function of its key name, so a test rebuilds the ~300 MB `model.safetensors` from
`audio_encoder_keys.json`: the same 301 keys without `audio_encoder.`, checked by the script).
`config.dac_on_the_hub.json` and `config.dac.json`: `save_pretrained`'s config.json with `DACConfig.model_type`
as transformers 4.46 and <= 4.44.2dev register it. The folder held only config.json and model.safetensors.
`io.safetensors`: `input_values` [1, 1, 4096] (fixed_signal(): 8 hops of 512), the encoder's `latents`
[1, 1024, 8], `audio_codes` [9, 8] = `DACModel.encode(...).audio_codes`, and `audio_values` [1, 1, 4096] =
`DACModel.decode` of those codes. (Upstream's encode keeps only whole hops: 4,000 samples give 7 frames, where
voxrelay's DacCodec pads to 8.)

## `transformers_dac/` (`make-transformers-dac`)

A model whose audio encoder is transformers' own `DacModel` (`model_type` "dac", as parler-tts-mini-v1.1 ships
its DAC) of the tests' tiny sizes (`TINY_DAC` in tests/helpers/parler.py: 4 encoder and 16 decoder channels,
`codebook_dim` 4, latent 16, 44.1 kHz / 512), built by `ParlerTTSConfig.from_sub_models_config` with the model
above and saved by upstream's `save_pretrained`: `config.json` as written, `model.safetensors` with only its
223 `audio_encoder.*` tensors (seeded: weights ~ N(0, 1/fan_in), the decoder's x0.6 so its tanh does not
saturate, Snake alphas 1 + 0.1 x, biases 0.01 x), and `io.safetensors`: `input_values` (fixed_signal()),
`audio_codes` [9, 8] = `DacModel.encode(...)`, `audio_values` [1, 4096] = `DacModel.decode(audio_codes=...)`.
voxrelay exports any DAC that is not descript's 44.1 kHz layout in this form (upstream's `DACModel` builds only
that layout: a tiny DAC written as `dac_on_the_hub` failed upstream's `from_pretrained` with size mismatches).

## `peft_0.13.2_lora_config_fields.json` (`make-peft-fields`)

The fields of `peft.LoraConfig` in peft 0.13.2 (2024-10, the peft of transformers 4.46's time): an
`adapter_config.json` with any other key is refused there, as peft 0.21's full dump was
(`LoraConfig.__init__() got an unexpected keyword argument 'alora_invocation_tokens'`).

## Live checks of voxrelay's exports (`scripts/parler_live_checks.py`, recorded 2026-11-29)

`PYTHONPATH=src .venv/bin/python scripts/parler_live_checks.py --record` builds this fixture's model in voxrelay
(`model.init_from` this folder, the DAC of `dac/` rebuilt), exports it, runs `check-export EXPORT --generate OURS`
(export --format parler, with that DAC and with `transformers_dac/`'s: from_pretrained, upstream
README's `model.generate(input_ids=…, prompt_input_ids=…)`,
greedy generation against voxrelay's codes and audio) and `check-adapter` (export --adapter-only of a LoRA model:
peft's `PeftModel.from_pretrained` and `AutoPeftModel` on `ParlerTTSForConditionalGeneration`) in this venv, and
writes their output to `live_checks.txt`.
Greedy on both sides with the ids above BOS banned (a random model picks them; upstream's DAC decode cannot
take them). Before voxrelay wrote `bos_token_id`, upstream's generate on the export failed in
`modeling_parler_tts.py` line 3523: `TypeError: unsupported operand type(s) for *: 'Tensor' and 'NoneType'`.
Before voxrelay wrote a DAC of other sizes as transformers' `DacModel`, upstream's `from_pretrained` of that
export failed: `RuntimeError: Error(s) in loading state_dict for ParlerTTSForConditionalGeneration` (size
mismatches in `audio_encoder.model.*`).
"""
