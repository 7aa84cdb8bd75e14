"""Load a voxrelay ``f5`` export with upstream f5-tts 1.1.22's own loader and run its sampler: the export is what the
released checkpoints are (run in the environment of scripts/f5_reference.py).

    /tmp/f5/bin/python scripts/f5_check_export.py EXPORT_DIR

Builds upstream's ``CFM(DiT(...))`` with the sizes voxrelay.json records and the export's vocab.txt (or bytes), reads
``model.safetensors`` with ``f5_tts.infer.utils_infer.load_checkpoint(model, path, "cpu", use_ema=True)``, checks
every tensor arrived, and samples 8 frames after a 20-frame prompt. Prints one JSON line; exit 1 on a mismatch.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from f5_tts.infer.utils_infer import load_checkpoint
from f5_tts.model import CFM, DiT
from safetensors.torch import load_file

folder = Path(sys.argv[1])
meta = json.loads((folder / "voxrelay.json").read_text())
s = meta["sizes"]
vocab_file = folder / "vocab.txt"
vocab = ({line: i for i, line in enumerate(vocab_file.read_text(encoding="utf-8").split("\n")[:-1])}
         if vocab_file.is_file() else None)
dit = DiT(dim=s["dim"], depth=s["depth"], heads=s["heads"], dim_head=s["dim_head"], ff_mult=s["ff_mult"],
          text_dim=s["text_dim"], conv_layers=s["conv_layers"], text_num_embeds=s["text_num_embeds"],
          mel_dim=s["mel_dim"], text_mask_padding=True, qk_norm=None, pe_attn_head=None, attn_backend="torch",
          attn_mask_enabled=False)
model = CFM(transformer=dit, mel_spec_kwargs=dict(n_fft=1024, hop_length=256, win_length=1024, n_mel_channels=100,
                                                  target_sample_rate=24000, mel_spec_type="vocos"),
            vocab_char_map=vocab)
model = load_checkpoint(model, str(folder / "model.safetensors"), "cpu", dtype=torch.float32, use_ema=True)
saved = load_file(str(folder / "model.safetensors"))
state = model.state_dict()
same = all(torch.equal(state[k[len("ema_model."):]], v) for k, v in saved.items())
with torch.inference_mode():
    out, _ = model.sample(cond=torch.randn(1, 20, 100), text=["hello"], duration=28, steps=4, seed=0)
print(json.dumps({"tensors": len(saved), "all_loaded_equal": same, "sample_shape": list(out.shape),
                  "finite": bool(torch.isfinite(out).all())}))
sys.exit(0 if same and torch.isfinite(out).all() else 1)
