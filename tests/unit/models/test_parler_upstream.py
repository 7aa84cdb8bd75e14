"""voxrelay on artifacts upstream parler-tts 0.2.3 wrote itself (tests/fixtures/parler/, made by
``scripts/parler_upstream.py`` in upstream's pinned environment, see its README): a training ``output_dir`` with a
``checkpoint-*`` folder written by accelerate's ``save_state(..., safe_serialization=False)`` (a pickled
``pytorch_model.bin``, the config one folder up), and parler's own DAC wrapper (``parler-tts/dac_44khZ_8kbps``'s
``DACModel``) in both ``model_type`` spellings, alone and inside a Parler model folder."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from voxrelay.errors import UserError
from voxrelay.models.base import DataSpec

FIXTURE = Path(__file__).parents[2] / "fixtures" / "parler"
OUTPUT_DIR = FIXTURE / "output_dir_training"
CHECKPOINT = OUTPUT_DIR / "checkpoint-1-epoch-0"
BOS, EOS = 33, 32  # the checkpoint model's ids: 4 codebooks of 32 codes


def _build(init_from: str, data: DataSpec = DataSpec(4, 32)):
    from voxrelay.config import load_config
    from voxrelay.models.registry import build_model

    cfg = load_config(None, ["model.family=parler", "model.preset=tiny", f"model.init_from={init_from}"]).model
    return build_model(cfg, data, seed=0)


def _forward(model, io: dict) -> tuple[torch.Tensor, torch.Tensor]:
    from voxrelay.models.parler import delay

    module = model.module.eval()
    with torch.no_grad():
        cond = module.encode(io["input_ids"], io["attention_mask"], io["prompt_input_ids"], io["prompt_attention_mask"])
        logits = module.decode(delay.decoder_inputs(io["labels"], BOS, EOS), cond)
    sums, counts = delay.codebook_losses(logits, io["labels"], BOS, EOS)
    return logits, delay.mean_of_means(sums, counts)


# --- an upstream training checkpoint (accelerate save_state) ---------------------------------------------------


def test_init_from_an_accelerate_checkpoint_gives_upstreams_logits() -> None:
    """No config.json in checkpoint-1-epoch-0: the config and the transcript tokenizer are the output_dir's."""
    assert not (CHECKPOINT / "config.json").exists() and (CHECKPOINT / "pytorch_model.bin").is_file()
    model = _build(str(CHECKPOINT))
    io = load_file(str(FIXTURE / "checkpoint_io.safetensors"))
    logits, loss = _forward(model, io)
    assert logits.shape == io["logits"].shape == (2, 4, 12, 40)
    assert (logits - io["logits"]).abs().max() < 1e-5  # the weights after upstream's optimizer step
    assert torch.allclose(loss, io["loss"], atol=1e-5)
    assert len(model.prompt_tokenizer) == model.config.prompt_vocab_size == 150  # output_dir's tokenizer


def test_a_checkpoint_pickle_that_is_not_plain_tensors_is_refused_unrun(tmp_path: Path) -> None:
    folder = tmp_path / "output_dir"
    shutil.copytree(OUTPUT_DIR, folder)
    marker = tmp_path / "pickle-ran"

    class Payload:  # unpickling it would call open(marker, "w")
        def __reduce__(self):
            return (open, (str(marker), "w"))

    torch.save({"decoder.model.decoder.layer_norm.weight": Payload()}, folder / CHECKPOINT.name / "pytorch_model.bin")
    with pytest.raises(UserError, match=r"pytorch_model\.bin.*(not plain tensors|weights_only)") as err:
        _build(str(folder / CHECKPOINT.name))
    assert not marker.exists() and "model.init_from" in str(err.value)


def test_init_from_an_accelerate_checkpoint_in_a_bucket(s3_root: str, tmp_path: Path, monkeypatch) -> None:
    """Seed 000 resumes from `gs://…/output_dir_training/checkpoint-200000-epoch-1`: the checkpoint's weights and
    the output_dir's config and tokenizer are fetched (not the optimizer state), then loaded as above."""
    from voxrelay import storage

    monkeypatch.setenv("VOXRELAY_CACHE", str(tmp_path / "cache"))
    remote = storage.join(s3_root, "output_dir_training")
    for path in OUTPUT_DIR.rglob("*"):
        if path.is_file():
            storage.put_file(path, storage.join(remote, path.relative_to(OUTPUT_DIR).as_posix()))
    model = _build(storage.join(remote, CHECKPOINT.name))
    logits, _ = _forward(model, load_file(str(FIXTURE / "checkpoint_io.safetensors")))
    assert (logits - load_file(str(FIXTURE / "checkpoint_io.safetensors"))["logits"]).abs().max() < 1e-5
    fetched = {p.name for p in (tmp_path / "cache").rglob("*") if p.is_file()}
    assert "pytorch_model.bin" in fetched and "config.json" in fetched and "optimizer.bin" not in fetched


# --- parler's DAC wrapper (parler-tts/dac_44khZ_8kbps) ----------------------------------------------------------


@pytest.fixture(scope="module")
def dac_weights(tmp_path_factory) -> Path:
    """The ~300 MB model.safetensors upstream's DACModel.save_pretrained wrote, rebuilt from its key list."""
    from tests.helpers.parler_dac import save_dac_folder

    return save_dac_folder(tmp_path_factory.mktemp("parler-dac"), FIXTURE) / "model.safetensors"


def _dac_folder(kind: str, weights: Path, tmp_path: Path) -> Path:
    folder = tmp_path / kind
    folder.mkdir()
    if kind == "parler-model":  # a Parler model folder: its DAC is its audio_encoder (upstream encodes with it)
        shutil.copy(FIXTURE / "config.json", folder / "config.json")
        state = load_file(str(FIXTURE / "model.safetensors"))
        state.update({"audio_encoder." + k: v for k, v in load_file(str(weights)).items()})
        save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    else:
        shutil.copy(FIXTURE / "dac" / f"config.{kind}.json", folder / "config.json")
        os.link(weights, folder / "model.safetensors")
    return folder


@pytest.mark.parametrize("kind", ["dac_on_the_hub", "dac", "parler-model"])
def test_parlers_dac_wrapper_encodes_and_decodes_as_upstream(kind: str, dac_weights: Path, tmp_path: Path) -> None:
    from voxrelay.codecs.dac import DacCodec

    codec = DacCodec.from_pretrained(str(_dac_folder(kind, dac_weights, tmp_path)))
    io = load_file(str(FIXTURE / "dac" / "io.safetensors"))
    with torch.no_grad():
        latents = codec.model.encoder(io["input_values"])
    assert (latents - io["latents"]).abs().max() < 1e-4 * io["latents"].abs().max()  # float rounding: 1e-5 seen
    assert np.array_equal(codec.encode(io["input_values"][0, 0].numpy()), io["audio_codes"].numpy())
    assert np.abs(codec.decode(io["audio_codes"].numpy()) - io["audio_values"].reshape(-1).numpy()).max() < 1e-5
    # 44100 / 512 = 86.13 frames/s (upstream's 86), not transformers' DacConfig.frame_rate (87)
    assert (codec.sample_rate, codec.num_codebooks, codec.codebook_size) == (44100, 9, 1024)
    assert codec.frame_rate == pytest.approx(86.13, abs=0.01) and int(codec.frame_rate) == 86
