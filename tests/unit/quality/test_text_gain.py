"""``eval/text_gain``: the held-out loss with another row's text minus with the row's own text."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.unit.models.test_codec_lm import random_codes, tiny_model, train_on
from voxrelay.data.shards import EncodedUtterance
from voxrelay.quality.samples import held_out_loss

pytestmark = pytest.mark.slow  # tiers: see tests/conftest.py


def _row(text: str, codes: np.ndarray) -> EncodedUtterance:
    return EncodedUtterance(text, text, None, None, 1.0, codes)


def test_a_model_that_reads_the_text_gains_from_it_and_one_that_cannot_does_not() -> None:
    torch.manual_seed(0)
    x, y = random_codes(12, seed=1), random_codes(12, seed=2)
    rows = [_row("aaaa", x), _row("bbbb", y)]
    reader = tiny_model()  # each text has its own audio: the text says which
    train_on(reader, [("aaaa", x), ("bbbb", y)], steps=150)
    read = held_out_loss(reader, reader.module, rows, torch.device("cpu"))
    assert read["eval/text_gain"] > 2.0  # nats per code: the other text predicts the wrong audio
    assert reader.module.training  # the module is handed back in the mode it came in
    deaf = tiny_model()  # both audios follow both texts: the text says nothing
    train_on(deaf, [("aaaa", x), ("aaaa", y), ("bbbb", x), ("bbbb", y)], steps=150)
    heard = held_out_loss(deaf, deaf.module, rows, torch.device("cpu"))
    assert abs(heard["eval/text_gain"]) < 0.2
    assert heard["eval/loss"] > read["eval/loss"]


def test_no_gain_without_two_different_texts_or_room_for_the_other_text() -> None:
    model = tiny_model(max_seq_len=40)
    one = [_row("hello", random_codes(10))]
    assert "eval/text_gain" not in held_out_loss(model, model.module, one, torch.device("cpu"))
    same = [_row("hello", random_codes(10, seed=1)), _row("hello", random_codes(10, seed=2))]
    assert "eval/text_gain" not in held_out_loss(model, model.module, same, torch.device("cpu"))
    # the second row's text does not fit the first row's 15 frames in 40 tokens: only the second row counts
    rows = [_row("hi", random_codes(15)), _row("a much longer text", random_codes(5))]
    out = held_out_loss(model, model.module, rows, torch.device("cpu"))
    cpu = torch.device("cpu")
    expected = (held_out_loss(model, model.module, [_row("hi", rows[1].codes)], cpu)["eval/loss"]
                - held_out_loss(model, model.module, [rows[1]], cpu)["eval/loss"])
    assert out["eval/text_gain"] == pytest.approx(expected, rel=1e-5)
