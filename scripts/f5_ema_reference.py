"""The EMA schedule f5-tts' trainer uses (ema_pytorch 0.8.3's ``EMA(model, include_online_model=False)``: defaults),
recorded for voxrelay's re-implementation (tests/unit/models/test_f5_dit.py).

Run it once in the environment of scripts/f5_reference.py:

    /tmp/f5/bin/python scripts/f5_ema_reference.py [OUT_DIR]       # default: tests/fixtures/f5

A one-weight model whose weight is set to 1, 2, 3, ... before each of 260 updates (one per optimizer step, as the
trainer calls it); writes ema_reference.json with the EMA's weight after each update.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from ema_pytorch import EMA

OUT = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "f5"
model = torch.nn.Linear(1, 1, bias=False)
ema = EMA(model, include_online_model=False)
after = []
for step in range(260):
    with torch.no_grad():
        model.weight.fill_(float(step + 1))
    ema.update()
    after.append(float(ema.ema_model.weight))
(OUT / "ema_reference.json").write_text(json.dumps({"weights_set": "step + 1 before update", "ema": after}))
print(after[:12], after[100:115], after[-1])
