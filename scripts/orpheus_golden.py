"""Record the orpheus family's outputs on tiny fixtures (tests/fixtures/orpheus_golden.json): the examples' ids,
three AdamW steps' losses (dropout 0.1) and seeded generations. Made once by the orpheus family as it stood before
it was re-expressed as a causal_lm layout (commit 02528ab), so tests/unit/models/test_orpheus_golden.py proves the
re-expression changed nothing. Run from the repository root: .venv/bin/python scripts/orpheus_golden.py OUT.json
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def record(folder: Path) -> dict:
    import numpy as np
    import torch

    from tests.helpers.orpheus import save_llama3_tokenizer, save_tiny_llama
    from voxrelay.models.base import LOSS_COUNT, DataSpec
    from voxrelay.models.orpheus.config import OrpheusConfig
    from voxrelay.models.registry import build_model

    tok = save_llama3_tokenizer(folder / "tok")
    cfg = OrpheusConfig(init_from=str(save_tiny_llama(folder / "orpheus", tok)), max_seq_len=512, dropout=0.1)
    model = build_model(cfg, DataSpec(7, 4096, ["tara", "leo"], 11.71875, 24000), 0)
    rng = np.random.default_rng(7)
    rows = []
    for n, text, speaker in [(6, "hello there", "tara"), (9, "<laugh> well, ok", "leo"), (4, "the dog", None)]:
        codes = rng.integers(0, 4096, (7, n))
        codes[0, 2] = codes[0, 1]  # a repeated first code: upstream drops that frame
        rows.append(type("Row", (), dict(text=text, speaker=speaker, description=None, codes=codes))())
    examples = [model.example(r) for r in rows]
    torch.manual_seed(0)
    optimizer = torch.optim.AdamW(model.module.parameters(), lr=1e-3)
    model.module.train()
    losses = []
    for packed in (False, True, False):
        batch = (model.collate_packed if packed else model.collate)(examples)
        batch = {k: v for k, v in batch.items() if not k.startswith(LOSS_COUNT)}
        terms = model.loss(model.module, batch)
        loss = terms["ce"].sum / terms["ce"].count
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append([float(loss.detach()), float(terms["speech"].sum)])
    generated = {f"{seed}/{top_p}": model.generate("hello there", "tara", max_frames=4, seed=seed, top_p=top_p)
                 .tolist() for seed in (1, 2) for top_p in (None, 0.5)}
    return {"examples": [{k: e[k].tolist() for k in ("input_ids", "labels")} for e in examples],
            "losses": losses, "generated": generated}


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        out = record(Path(tmp))
    Path(sys.argv[1]).write_text(json.dumps(out))
    print(f"wrote {sys.argv[1]}: losses {out['losses']}")
