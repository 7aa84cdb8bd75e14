"""Seed 003's rows on the tiny random VibeVoice: a one-line dialogue with the row's own voice prompts (a
``voice_prompts`` column) becomes an example prompted per speaker; rows with no way to a prompt are counted in
a warning naming the fix; ``synthesize --script`` of the seed's one-line dialogue speaks with two prompts."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.vibevoice import save_tiny_vibevoice
from voxrelay.codecs.pcm import PcmCodec
from voxrelay.data.shards import EncodedUtterance
from voxrelay.models.base import DataSpec, Request
from voxrelay.models.registry import build_model
from voxrelay.models.vibevoice.config import VibeVoiceFamilyConfig

PCM = PcmCodec(24000)
SEED_LINE = (Path(__file__).parents[2] / "fixtures/vibevoice/seed003/text/d001.txt").read_text(encoding="utf-8")


def _clip(seconds: float, freq: float) -> np.ndarray:
    t = np.arange(int(seconds * 24000)) / 24000
    return PCM.encode(0.3 * np.sin(2 * np.pi * freq * t)).astype(np.int16)


def _row(row_id: str, seconds: float, prompts: tuple = ()) -> EncodedUtterance:
    return EncodedUtterance(row_id, SEED_LINE, None, None, seconds, _clip(seconds, 150.0), voice_prompts=prompts)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    cfg = VibeVoiceFamilyConfig(init_from=str(save_tiny_vibevoice(tmp_path_factory.mktemp("vv") / "tiny")),
                                max_length=1024, voice_prompt_drop_rate=0.0)
    return build_model(cfg, DataSpec(1, 65536, [], 24000.0, 24000), seed=0)


def test_a_rows_own_voice_prompts_prompt_its_speakers_in_label_order(model, caplog):
    a, b = _clip(1.0, 300.0), _clip(0.5, 500.0)
    row, bare = _row("d001", 2.0, (a, b)), _row("d002", 1.0)
    with caplog.at_level(logging.WARNING):
        model.use_corpus([row, bare])
    assert "1 of 2 training rows have no voice prompts" in caplog.text and "`voice_prompts` column" in caplog.text
    e = model.example(row)
    assert [len(c) for c in e["clips"]] == [24000, 12000, 48000] and list(e["is_target"]) == [False, False, True]
    assert np.allclose(e["clips"][1] / np.abs(e["clips"][1]).max(), b.reshape(-1) / np.abs(b).max(), atol=1e-3)
    hop, pad = model.maker.hop, model.maker.ids["pad"]
    assert (e["input_ids"] == pad).sum() == sum(-(-n // hop) for n in (24000, 12000, 48000))  # latents
    text = model.maker.tokenizer.decode(e["input_ids"][e["input_ids"] != pad])
    assert " Voice input:\n Speaker 0:<|vision_start|><|vision_end|>\n Speaker 1:<|vision_start|>" in text
    assert (" Speaker 0: 今天的天气真不错,适合出去散步。\n Speaker 1: 是啊,阳光明媚,心情都变好了。\n"
            " Speaker 0: 要不要一起去公园?\n Speech output:") in text
    assert len(set(e["clip_keys"].tolist())) == 3 and model.length(row) == len(e["input_ids"])
    assert len(model.example(bare)["clips"]) == 1  # no prompts of its own, no speaker column: none


def test_synthesize_speaks_seed_003s_one_line_dialogue_with_a_prompt_per_speaker(model):
    clips = (_clip(1.0, 300.0).reshape(-1) / 32767.0, _clip(0.5, 500.0).reshape(-1) / 32767.0)
    speech = model.speak(Request(SEED_LINE, voice_prompts=clips), PCM, max_frames=2)
    assert speech.sample_rate == 24000 and speech.frames <= 2 and speech.wav.size == speech.frames * 3200
    assert np.isfinite(speech.wav).all()
    assert [c.size for c in model.voice_references(Request(SEED_LINE, voice_prompts=clips))] == [24000, 12000]


def test_an_eval_speaks_a_held_out_row_with_its_own_voice_prompts(model):
    """Training's and `voxrelay eval`'s samples (quality.samples.generate_samples) prompt each speaker of a
    held-out row with the row's own clips, as its training example does, and score speaker similarity
    against them."""
    from voxrelay.quality.samples import generate_samples

    a, b = _clip(1.0, 300.0), _clip(0.5, 500.0)
    row = _row("d001", 1.0, (a, b))
    row.ref_audio = None
    samples, _ = generate_samples(model, PCM, [row], seed_base=0)
    voices = samples[0].voices
    assert voices is not None and [v.size for v in voices] == [24000, 12000]
    assert np.allclose(voices[1] / np.abs(voices[1]).max(), b.reshape(-1) / np.abs(b).max(), atol=1e-3)


def test_voice_prompts_reach_a_base_held_in_bf16_outside_autocast(tmp_path):
    """The vibevoice-lora recipe keeps its frozen base in bf16; synthesize and eval on a CPU run without autocast, so
    the prompts' float32 audio met bf16 convolutions ("Input type (float) and bias type (c10::BFloat16)")."""
    import torch

    cfg = VibeVoiceFamilyConfig(init_from=str(save_tiny_vibevoice(tmp_path / "tiny")), max_length=1024,
                                voice_prompt_drop_rate=0.0, weights_dtype="bfloat16")
    bf16 = build_model(cfg, DataSpec(1, 65536, [], 24000.0, 24000), seed=0)
    assert next(bf16.net.model.audio_tower.parameters()).dtype == torch.bfloat16
    clips = (_clip(1.0, 300.0).reshape(-1) / 32767.0, _clip(0.5, 500.0).reshape(-1) / 32767.0)
    speech = bf16.speak(Request(SEED_LINE, voice_prompts=clips), PCM, max_frames=2)
    assert speech.sample_rate == 24000 and speech.frames <= 2 and np.isfinite(speech.wav).all()
