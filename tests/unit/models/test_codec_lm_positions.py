"""codec_lm with ``model.text_position_scale``: text and audio on one time axis of rotary positions."""

from __future__ import annotations

from pathlib import Path

import torch

from tests.unit.models.test_codec_lm import K, assert_saved_setting, overfit, random_codes, tiny_model
from voxrelay.models.codec_lm.model import CodecLM


def test_text_sits_at_scaled_positions_and_each_frame_at_its_index() -> None:
    model = tiny_model(text_position_scale=1.75)
    ex = model.encode_example("abcd", random_codes(3))
    # [BOS, a, b, c, d, AUDIO_START, 3 frames x K codes, AUDIO_END]
    assert ex["position_ids"].tolist() == [0, 2, 4, 5, 7, 0] + [1] * K + [2] * K + [3] * K + [4]
    assert len(ex["position_ids"]) == len(ex["input_ids"])
    batch = model.collate([ex, model.encode_example("ab", random_codes(1))])
    assert batch["position_ids"][1].tolist()[: 3 + 1 + K + 1] == [0, 2, 4, 0, 1, 1, 2]
    assert batch["position_ids"][1, 3 + 1 + K + 1 :].eq(0).all()  # padding
    # without a scale: no positions, the plain causal LM (existing models and configs)
    plain = tiny_model()
    assert "position_ids" not in plain.encode_example("abcd", random_codes(3))
    assert "position_ids" not in plain.collate([plain.encode_example("ab", random_codes(1))])


def test_the_positions_reach_the_loss() -> None:
    model = tiny_model(text_position_scale=3.0)
    batch = model.collate([model.encode_example("a sentence", random_codes(6))])
    with_positions = model.loss(model.module, batch)["ce"].sum
    without = model.loss(model.module, {k: v for k, v in batch.items() if k != "position_ids"})["ce"].sum
    assert not torch.isclose(with_positions, without)


def test_cached_generation_uses_the_training_positions() -> None:
    # each greedy choice of the KV-cached loop is the argmax of one full forward over the training example
    model = tiny_model(text_position_scale=1.75, seed=3)
    out = model.generate("hi there", max_frames=8, temperature=0)
    ex = model.encode_example("hi there", out)
    ids = torch.as_tensor(ex["input_ids"])[None]
    with torch.no_grad():
        logits = model.module(input_ids=ids, position_ids=torch.as_tensor(ex["position_ids"])[None],
                              attention_mask=torch.ones_like(ids)).logits[0]
    audio = model.layout.codes_to_ids(out)
    start = len(ex["input_ids"]) - audio.size - 1  # the first audio id's index
    for i, chosen in enumerate(audio.tolist()):
        lo, hi = model.layout.codebook_range(i % K)
        assert lo + int(logits[start - 1 + i, lo:hi].argmax()) == chosen, i


def test_overfits_one_example_and_generation_reproduces_it() -> None:
    torch.manual_seed(0)
    model = tiny_model(text_position_scale=2.0)
    codes = random_codes(16, seed=7)
    assert overfit(model, "a tiny sentence", codes) < 0.05
    out = model.generate("a tiny sentence", temperature=0, seed=0)
    assert out.shape == codes.shape and (out == codes).mean() >= 0.9


def test_the_scale_is_saved_with_the_model(tmp_path: Path) -> None:
    assert_saved_setting(tmp_path / "m", "text_position_scale", 1.5, text_position_scale=1.5)


def test_fine_tuning_keeps_the_positions_it_was_trained_with(tmp_path: Path) -> None:
    import pytest

    from tests.unit.models.test_codec_lm import C, tiny_cfg
    from voxrelay.errors import UserError

    tiny_model(text_position_scale=1.5).save_pretrained(tmp_path / "m")
    tuned = CodecLM.build(tiny_cfg(init_from=str(tmp_path / "m"), text_position_scale=1.5), K, C, [], seed=0)
    assert tuned.text_position_scale == 1.5
    for other in (None, 2.0):
        with pytest.raises(UserError, match=r"set model.text_position_scale=1\.5"):
            CodecLM.build(tiny_cfg(init_from=str(tmp_path / "m"), text_position_scale=other), K, C, [], seed=0)
