"""codec_lm with ``model.audio_embedding: codec``: audio inputs projected from the codec's code vectors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.unit.models.test_codec_lm import C, K, overfit, random_codes, tiny_cfg
from voxrelay.errors import UserError
from voxrelay.models.base import DataSpec
from voxrelay.models.codec_lm.code_vectors import CodeVectorEmbedding
from voxrelay.models.codec_lm.model import CodecLM

D = 5


def vectors(seed: int = 0) -> np.ndarray:
    v = np.random.default_rng(seed).normal(size=(K, C, D)).astype(np.float32)
    v[0, 3] = v[0, 7]  # two codes of codebook 0 that sound the same
    return v


def model_with_vectors(seed: int = 0, **kw) -> CodecLM:
    cfg = tiny_cfg(audio_embedding="codec", **kw)
    return CodecLM.build(cfg, K, C, [], seed=seed, code_vectors=vectors())


def test_codes_with_the_same_vector_get_the_same_input_and_text_rows_stay_free() -> None:
    model = model_with_vectors()
    embedding = model.module.get_input_embeddings()
    assert isinstance(embedding, CodeVectorEmbedding)
    lo, _ = model.layout.codebook_range(0)
    rows = embedding.weight
    assert torch.equal(rows[lo + 3], rows[lo + 7]) and not torch.equal(rows[lo + 3], rows[lo + 4])
    assert rows.shape == model.module.get_output_embeddings().weight.shape
    # the scale of a free row (Llama's std 0.02), and text rows are the base embedding's own
    assert 0.005 < float(rows[lo : lo + C].detach().std()) < 0.08
    assert torch.equal(rows[: lo], embedding.base.weight[: lo])
    # seeded like the rest of the model
    again = model_with_vectors()
    assert torch.equal(again.module.get_input_embeddings().weight, rows)


def test_missing_vectors_name_the_setting_and_the_fix() -> None:
    with pytest.raises(UserError, match="model.audio_embedding=free"):
        CodecLM.build(tiny_cfg(audio_embedding="codec"), K, C, [], seed=0)


@pytest.mark.parametrize("frames", [None, 2])
def test_trains_generates_and_saves_as_a_plain_model(tmp_path: Path, frames: int | None) -> None:
    torch.manual_seed(0)
    model = model_with_vectors(frames_per_position=frames)
    codes = random_codes(10, seed=2)
    assert overfit(model, "some words", codes, steps=150) < 0.1
    out = model.generate("some words", temperature=0)
    assert out.shape == codes.shape and (out == codes).mean() >= 0.9
    # the projection trains and is in the checkpoint; the vectors come from the data, not the checkpoint
    state = model.module.state_dict()
    assert "model.embed_tokens.proj" in state and not any(k.endswith("vectors") for k in state)
    fresh = model_with_vectors(seed=5, frames_per_position=frames)
    fresh.module.load_state_dict(state)
    np.testing.assert_array_equal(fresh.generate("some words", temperature=0), out)
    # a saved folder holds the computed rows as a plain embedding and generates the same
    model.save_pretrained(tmp_path / "m")
    assert isinstance(model.module.get_input_embeddings(), CodeVectorEmbedding)  # restored after saving
    loaded = CodecLM.from_pretrained(tmp_path / "m")
    assert type(loaded.module.get_input_embeddings()).__name__ in ("Embedding", "SlotSumEmbedding")
    np.testing.assert_array_equal(loaded.generate("some words", temperature=0), out)
    # fine-tuning that folder goes on with free rows
    with pytest.raises(UserError, match="set model.audio_embedding=free"):
        CodecLM.build(tiny_cfg(audio_embedding="codec", init_from=str(tmp_path / "m"), frames_per_position=frames),
                      K, C, [], seed=0, code_vectors=vectors())
    tuned = CodecLM.build(tiny_cfg(init_from=str(tmp_path / "m"), frames_per_position=frames), K, C, [], seed=0)
    np.testing.assert_array_equal(tuned.generate("some words", temperature=0), out)


def test_the_built_in_codec_gives_its_centroids_and_the_note_stays_json() -> None:
    from voxrelay.codecs.mel_kmeans import MelKMeansCodec

    codec = MelKMeansCodec(sample_rate=16000, num_codebooks=2, codebook_size=8, hop_length=320)
    wav = np.sin(np.linspace(0, 800, 32000)).astype(np.float32) * np.linspace(0, 1, 32000, dtype=np.float32)
    codec.fit([wav], seed=0)
    spec = DataSpec.from_prepared({"num_codebooks": 2, "speakers": ["a"]}, codec)
    assert spec.code_vectors.shape == (2, 8, codec.n_mels)
    np.testing.assert_array_equal(spec.code_vectors, codec._centroids.numpy())
    assert DataSpec(**json.loads(json.dumps(spec.to_note()))) == spec
