"""The orpheus family, re-expressed as the causal_lm family's orpheus layout, against what it did before
(tests/fixtures/orpheus_golden.json, written by scripts/orpheus_golden.py at 02528ab, before the re-expression)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from scripts.orpheus_golden import record

GOLDEN = Path(__file__).resolve().parents[2] / "fixtures" / "orpheus_golden.json"


def test_orpheus_examples_losses_and_generations_are_as_before_the_layout(tmp_path: Path) -> None:
    want, got = json.loads(GOLDEN.read_text()), record(tmp_path)
    assert got["examples"] == want["examples"]  # ids and labels: exact
    # three AdamW steps with dropout 0.1, padded and packed: equal up to float summation order across hosts
    np.testing.assert_allclose(got["losses"], want["losses"], rtol=1e-5)
    assert got["generated"] == want["generated"]
