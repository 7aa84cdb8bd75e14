#!/usr/bin/env python3
"""Live checks of voxrelay's Parler-TTS exports in upstream's own code (by hand, not in CI):

    PYTHONPATH=src .venv/bin/python scripts/parler_live_checks.py [--work DIR]

In voxrelay's environment it builds the upstream fixture's model (tests/fixtures/parler/, ``model.init_from``)
with parler's DAC wrapper rebuilt from the fixture's key list (deterministic weights, tests/helpers/parler_dac.py),
then:

1. ``export --format parler`` and voxrelay's greedy generation of the fixture's first row (codes and audio), once
   with that DAC (written as parler's wrapper) and once with a tiny DAC of other sizes (``transformers_dac/``,
   written as transformers' ``DacModel``);
   ``scripts/parler_upstream.py check-export DIR --generate OURS`` then runs, in upstream's pinned venv, its
   from_pretrained, README's ``model.generate(input_ids=…, prompt_input_ids=…)`` and the same greedy generation;
2. a LoRA model (seeded adapters, moved off zero) exported ``--adapter-only`` and its logits on the fixture's
   inputs; ``scripts/parler_upstream.py check-adapter`` loads it with peft's ``PeftModel.from_pretrained`` and
   ``AutoPeftModel`` on upstream's ``ParlerTTSForConditionalGeneration`` and compares.

Exit status: 1 if an upstream check fails. ``--record`` writes their output to tests/fixtures/parler/live_checks.txt.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "tests" / "fixtures" / "parler"
UPSTREAM = ["python3", str(REPO / "scripts" / "parler_upstream.py")]
MAX_LENGTH = 40  # decoder columns, the start column included
RECORD = FIXTURE / "live_checks.txt"
TINY_DAC = FIXTURE / "transformers_dac"  # a DAC of other sizes than descript's, as upstream saves one
NOISE = re.compile(r"it/s\]|s/it\]|kernels-community")  # progress bars, bitsandbytes' CPU notice


def parler_dac(work: Path):
    """DacCodec of parler's DAC wrapper (config.dac_on_the_hub.json + the deterministic ~300 MB weights)."""
    from safetensors.torch import save_file

    from tests.helpers.parler_dac import dac_state
    from voxrelay.codecs.dac import DacCodec

    folder = work / "dac_44khZ_8kbps"
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(FIXTURE / "dac" / "config.dac_on_the_hub.json", folder / "config.json")
    keys = json.loads((FIXTURE / "audio_encoder_keys.json").read_text())
    save_file(dac_state({k.removeprefix("audio_encoder."): v["shape"] for k, v in keys.items()}),
              str(folder / "model.safetensors"), metadata={"format": "pt"})
    return DacCodec.from_pretrained(str(folder))


def fixture_model(work: Path):
    from tests.helpers.parler import save_parts
    from voxrelay.config import load_config
    from voxrelay.models.base import DataSpec
    from voxrelay.models.registry import build_model

    parts = save_parts(work / "parts")
    overrides = ["model.family=parler", "model.preset=tiny", f"model.init_from={FIXTURE}",
                 f"model.description_tokenizer={parts['prompt_tokenizer']}",
                 f"model.prompt_tokenizer={parts['prompt_tokenizer']}", f"model.text_encoder={parts['text_encoder']}"]
    cfg = load_config(None, overrides).model
    return build_model(cfg, DataSpec(9, 1024), seed=0), cfg


class NoUnusedIds:
    """The module with the ids above BOS (1026-1087, no DAC code) banned, as upstream's generate is asked to
    (``suppress_tokens``): a random model picks them, and upstream's DAC decode cannot take them."""

    def __init__(self, module) -> None:
        self.module = module
        self.config = module.config
        self.training = module.training

    def decode(self, *args, **kwargs):
        logits = self.module.decode(*args, **kwargs)
        logits[..., self.config.decoder.bos_token_id + 1:] = float("-inf")
        return logits


def generation(model, codec, work: Path, name: str) -> Path:
    """voxrelay's greedy codes and audio for the fixture's row 0 (its ids fit the fixture's vocabularies)."""
    import torch
    from safetensors.torch import load_file, save_file

    from voxrelay.models.parler.generation import SamplingConfig, generate

    io = load_file(str(FIXTURE / "io.safetensors"))
    ids, prompt = io["input_ids"][:1], io["prompt_input_ids"][:1]  # row 0: no padding
    k = model.num_codebooks
    module = model.module.eval()
    with torch.no_grad():
        cond = module.encode(ids, torch.ones_like(ids), prompt, torch.ones_like(prompt))
        codes = generate(NoUnusedIds(module), cond, SamplingConfig(do_sample=False, max_length=MAX_LENGTH,
                                                                   min_new_tokens=k + 1)).codes[0]
    audio = torch.from_numpy(codec.decode(codes.numpy()))
    ours = work / f"ours_generate_{name}.safetensors"
    save_file({"input_ids": ids.contiguous(), "prompt_input_ids": prompt.contiguous(), "codes": codes.contiguous(),
               "audio": audio, "max_length": torch.tensor(MAX_LENGTH), "min_new_tokens": torch.tensor(k + 1)},
              str(ours))
    print(f"voxrelay greedy: codes {tuple(codes.shape)}, audio {audio.numel()} samples")
    return ours


def adapter(model, cfg, codec, work: Path) -> Path:
    import torch
    from safetensors.torch import load_file, save_file

    from voxrelay.inference import export
    from voxrelay.models.base import DataSpec
    from voxrelay.models.lora_config import LoraConfig
    from voxrelay.models.parler import delay
    from voxrelay.train.strategies import apply_lora, base_hash, describe_base

    note = {"base": describe_base(cfg, 0), "base_hash": base_hash(model.module), "seed": 0,
            "model": cfg.model_dump(mode="json"), "data": DataSpec(9, 1024).to_note()}
    torch.manual_seed(0)
    apply_lora(model, LoraConfig())
    with torch.no_grad():
        for name, p in model.module.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)
    export(model, codec, work / "adapter", note, adapter_only=True)
    io = load_file(str(FIXTURE / "io.safetensors"))
    module = model.module.get_base_model().eval()
    with torch.no_grad():
        cond = module.encode(io["input_ids"], io["attention_mask"], io["prompt_input_ids"], io["prompt_attention_mask"])
        logits = module.decode(delay.decoder_inputs(io["labels"]), cond)
    ours = work / "ours_adapter.safetensors"
    save_file({"logits": logits.contiguous()}, str(ours))
    return ours


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, help="keep the exports here (default: a temporary folder)")
    parser.add_argument("--record", action="store_true", help=f"write upstream's output to {RECORD}")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="parler-live-"))
    sys.path.insert(0, str(REPO))
    from voxrelay.codecs.dac import DacCodec
    from voxrelay.inference import export

    codec = parler_dac(work)
    model, cfg = fixture_model(work)
    checks = []
    # descript's 44.1 kHz DAC (written as parler's wrapper) and a DAC of other sizes (as transformers' DacModel)
    for name, dac in (("export", codec), ("export-transformers-dac", DacCodec.from_pretrained(str(TINY_DAC)))):
        export(model, dac, work / name, fmt="parler")
        checks.append(["check-export", str(work / name), "--generate", str(generation(model, dac, work, name))])
    checks.append(["check-adapter", str(work / "adapter"), str(adapter(model, cfg, codec, work))])
    status, lines = 0, [f"# scripts/parler_live_checks.py, {time.strftime('%Y-%m-%d')}"]
    for check in checks:
        res = subprocess.run([*UPSTREAM, *check], capture_output=True, text=True)
        shown = [line for line in (res.stdout + res.stderr).splitlines() if not NOISE.search(line)]
        lines += [f"$ python3 scripts/parler_upstream.py {check[0]} ...", *shown]
        print("\n".join(lines[-len(shown) - 1:]))
        status |= res.returncode
    if args.record:
        RECORD.write_text("\n".join(lines) + "\n")
    print(f"work folder: {work}")
    return status


if __name__ == "__main__":
    sys.exit(main())
