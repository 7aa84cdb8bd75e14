"""codec_lm with ``model.frames_per_position``: one position per G frames, one head per code."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.unit.models.test_codec_lm import C, K, assert_saved_setting, overfit, random_codes, tiny_cfg, tiny_model
from voxrelay.models.codec_lm import grouped
from voxrelay.models.codec_lm.model import CodecLM, SequenceTooLongError


def test_group_codes_puts_frame_g_codebook_k_at_slot_g_times_k_and_pads_the_last_group() -> None:
    codes = np.array([[1, 2, 3, 4, 5], [11, 12, 13, 14, 15]])
    slots = grouped.group_codes(codes, 3)
    assert slots.tolist() == [[1, 4], [11, 14], [2, 5], [12, 15], [3, -1], [13, -1]]
    full = np.random.default_rng(0).integers(0, 9, size=(3, 12))
    np.testing.assert_array_equal(grouped.ungroup_codes(grouped.group_codes(full, 4), 4), full)


def test_example_has_one_position_per_group_and_labels_only_the_audio() -> None:
    model = tiny_model(frames_per_position=2)
    layout = model.layout
    assert layout.num_codebooks == 2 * K  # one id range (one head) per code of a position
    ex = model.encode_example("abc", random_codes(5, seed=1))
    ids, labels = ex["input_ids"], ex["labels"]
    # [BOS, a, b, c, AUDIO_START] + 3 groups: frames 0-1, 2-3, then frame 4 and AUDIO_END in frame 5's place
    assert ids.shape == (5 + 3, 2 * K) and model.sequence_length("abc", 5) == 8
    assert (ids[:5, 1:] == -1).all()  # text and specials fill slot 0 only
    assert ids[0, 0] == layout.bos_id and ids[4, 0] == layout.audio_start_id
    assert (labels[:5] == -100).all()
    assert ids[7, K] == labels[7, K] == layout.audio_end_id and (ids[7, K + 1 :] == -1).all()
    assert (labels[7, K + 1 :] == -100).all() and (labels[7, :K] >= 0).all()
    for s in range(2 * K):  # each slot uses its own id range
        lo, hi = layout.codebook_range(s)
        assert ((ids[5:7, s] >= lo) & (ids[5:7, s] < hi)).all()
    # 2 frames + AUDIO_END: an extra group holding only AUDIO_END
    short = model.encode_example("a", random_codes(2))
    assert short["labels"][-1].tolist() == [layout.audio_end_id] + [-100] * (2 * K - 1)
    batch = model.collate([ex, short])
    assert batch["input_ids"].shape == (2, 8, 2 * K) and int(batch["loss_count/ce"]) == (5 * K + 1) + (2 * K + 1)
    assert batch["attention_mask"][1].tolist() == [1] * 5 + [0] * 3


def test_each_slot_is_scored_over_its_own_codes_and_audio_end() -> None:
    model = tiny_model(frames_per_position=2, seed=1)
    layout = model.layout
    batch = model.collate([model.encode_example("ab", random_codes(3, seed=2))])
    loss_sum, count, _ = model.loss(model.module, batch)["ce"]
    with torch.no_grad():
        logits = model.module(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[0]
    expected, n = 0.0, 0
    for pos in range(batch["labels"].shape[1] - 1):
        for s, target in enumerate(batch["labels"][0, pos + 1].tolist()):
            if target == -100:
                continue
            lo, hi = layout.codebook_range(s)
            choices = [*range(lo, hi), *([layout.audio_end_id] if s % K == 0 else [])]
            expected += float(F.cross_entropy(logits[pos, choices][None], torch.tensor([choices.index(target)])))
            n += 1
    assert int(count) == n == 3 * K + 1  # 3 frames and AUDIO_END
    assert float(loss_sum.detach()) == pytest.approx(expected, rel=1e-5)


def test_the_order_of_frames_within_a_position_reaches_the_model() -> None:
    model = tiny_model(frames_per_position=2, seed=2)
    codes = random_codes(2, seed=3)
    swapped = codes[:, ::-1].copy()
    a, b = (model.collate([model.encode_example("x", c)]) for c in (codes, swapped))
    with torch.no_grad():
        embed = model.module.get_input_embeddings()
        assert not torch.allclose(embed(a["input_ids"])[0, -2], embed(b["input_ids"])[0, -2])


def test_cached_generation_picks_what_a_full_forward_over_the_training_example_picks() -> None:
    model = tiny_model(frames_per_position=2, text_position_scale=0.5, seed=3)
    out = model.generate("hi there", max_frames=7, temperature=0)
    assert out.shape == (K, 7)
    batch = model.collate([model.encode_example("hi there", out)])
    with torch.no_grad():
        logits = model.module(input_ids=batch["input_ids"], position_ids=batch["position_ids"],
                              attention_mask=batch["attention_mask"]).logits[0]
    scores = grouped.slot_scores(model, logits)[:, :, :C]  # no AUDIO_END: max_frames stopped it
    start = len(model._prompt_ids("hi there", None)) - 1  # AUDIO_START predicts the first group
    slots = grouped.group_codes(out, 2)
    for g in range(slots.shape[1]):
        for s in range(2 * K):
            if slots[s, g] >= 0:
                assert int(scores[start + g, s].argmax()) == slots[s, g], (g, s)


@pytest.mark.parametrize("scale", [None, 1.0])
def test_overfits_one_example_and_generation_reproduces_it(scale: float | None) -> None:
    torch.manual_seed(0)
    model = tiny_model(frames_per_position=3, text_position_scale=scale)
    codes = random_codes(16, seed=7)
    assert overfit(model, "a tiny sentence", codes, steps=150) < 0.05
    out = model.generate("a tiny sentence", temperature=0, seed=0)
    assert out.shape == codes.shape and (out == codes).mean() >= 0.9  # AUDIO_END inside the sixth group
    assert model.generate("a tiny sentence", max_frames=4, temperature=0).shape == (K, 4)


def test_saved_and_loaded_with_the_model_and_checked_on_fine_tuning(tmp_path: Path) -> None:
    from voxrelay.errors import UserError

    assert_saved_setting(tmp_path / "m", "frames_per_position", 2, frames_per_position=2)
    model = CodecLM.from_pretrained(tmp_path / "m")
    tuned = CodecLM.build(tiny_cfg(init_from=str(tmp_path / "m"), frames_per_position=2), K, C, [], seed=0)
    assert tuned.frames_per_position == 2 and tuned.layout == model.layout
    for other in (None, 3):
        with pytest.raises(UserError, match=r"set model.frames_per_position=2"):
            CodecLM.build(tiny_cfg(init_from=str(tmp_path / "m"), frames_per_position=other), K, C, [], seed=0)


def test_bad_codes_and_too_long_utterances_are_refused() -> None:
    model = tiny_model(frames_per_position=2, max_seq_len=20)
    with pytest.raises(ValueError, match="different codec"):
        model.encode_example("x", np.zeros((K + 1, 4), dtype=np.int64))
    with pytest.raises(SequenceTooLongError, match="model.max_seq_len"):
        model.encode_example("x", random_codes(40))
    assert model.encode_example("x", random_codes(30))["input_ids"].shape[0] == 3 + 16


def test_lora_trains_a_grouped_model_through_the_slot_embedding() -> None:
    from voxrelay.models.lora_config import LoraConfig
    from voxrelay.train.strategies import apply_lora

    torch.manual_seed(0)
    model = tiny_model(frames_per_position=2)
    apply_lora(model, LoraConfig(embeddings="full"))  # a random init: its slot embedding trains in full
    codes = random_codes(8, seed=5)
    batch = model.collate([model.encode_example("hi", codes)])
    before = model.loss(model.module, batch)
    assert overfit(model, "hi", codes, steps=80) < 0.2 * float(before["ce"].sum.detach() / before["ce"].count)
    assert model.generate("hi", temperature=0).shape[0] == K
