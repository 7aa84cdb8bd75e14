"""``export --format parler`` writes the run's DAC as upstream saves one: descript's 44.1 kHz layout as parler's
DAC wrapper (``dac_on_the_hub``, the only layout that wrapper builds: mini v0.1/v1), any other DAC as transformers'
``DacModel`` (``model_type`` "dac" with every size: mini v1.1). Each against a folder upstream's own
``save_pretrained`` wrote (tests/fixtures/parler/ and its ``transformers_dac/``: ``scripts/parler_upstream.py``
make-fixture / make-transformers-dac); ``scripts/parler_live_checks.py`` loads both exports in upstream's code and
generates from them (tests/fixtures/parler/live_checks.txt)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

FIXTURE = Path(__file__).parents[2] / "fixtures" / "parler"
TRANSFORMERS_DAC = FIXTURE / "transformers_dac"


@pytest.fixture(scope="module")
def parts(tmp_path_factory) -> dict[str, Path]:
    from tests.helpers.parler import save_parts

    return save_parts(tmp_path_factory.mktemp("parler-parts"))


def _export(parts: dict[str, Path], codec, out: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """The upstream fixture's model (``model.init_from``) exported with ``codec``: (config.json, audio_encoder.*)."""
    from voxrelay.config import load_config
    from voxrelay.inference import export
    from voxrelay.models.base import DataSpec
    from voxrelay.models.registry import build_model

    cfg = load_config(None, ["model.family=parler", "model.preset=tiny", f"model.init_from={FIXTURE}",
                             f"model.text_encoder={parts['text_encoder']}",
                             f"model.prompt_tokenizer={parts['prompt_tokenizer']}",
                             f"model.description_tokenizer={parts['prompt_tokenizer']}"]).model
    export(build_model(cfg, DataSpec(9, 1024), seed=0), codec, out, fmt="parler")
    saved = load_file(str(out / "model.safetensors"))
    return json.loads((out / "config.json").read_text()), {k: v for k, v in saved.items()
                                                           if k.startswith("audio_encoder.")}


def test_a_model_whose_dac_is_transformers_dacmodel_encodes_and_decodes_as_upstream() -> None:
    """As ``codec.path`` (or ``model.init_from``'s DAC): a Parler folder whose ``audio_encoder`` is a transformers
    DacConfig of other sizes than descript's."""
    from voxrelay.codecs.dac import DacCodec

    codec = DacCodec.from_pretrained(str(TRANSFORMERS_DAC))
    io = load_file(str(TRANSFORMERS_DAC / "io.safetensors"))
    assert (codec.model.config.encoder_hidden_size, codec.model.config.hidden_size) == (4, 16)
    assert np.array_equal(codec.encode(io["input_values"][0, 0].numpy()), io["audio_codes"].numpy())
    audio = codec.decode(io["audio_codes"].numpy())
    assert np.abs(audio - io["audio_values"].reshape(-1).numpy()).max() < 1e-5 and np.std(audio) > 0.05


def test_a_dac_of_descripts_layout_is_written_as_parlers_dac_wrapper(parts, tmp_path) -> None:
    from tests.helpers.parler_dac import save_dac_folder
    from voxrelay.codecs.dac import DacCodec

    codec = DacCodec.from_pretrained(str(save_dac_folder(tmp_path / "dac_44khZ_8kbps", FIXTURE)))
    config, ours = _export(parts, codec, tmp_path / "up")
    theirs = json.loads((FIXTURE / "audio_encoder_keys.json").read_text())
    assert {k: list(v.shape) for k, v in ours.items()} == {k: v["shape"] for k, v in theirs.items()}
    upstream = json.loads((FIXTURE / "config.json").read_text())["audio_encoder"]
    assert config["audio_encoder"] == {k: upstream[k] for k in config["audio_encoder"]}
    assert config["audio_encoder"]["model_type"] == "dac_on_the_hub"
    back = DacCodec.from_pretrained(str(tmp_path / "up")).model.state_dict()  # the weights: norm folded back
    assert all(torch.allclose(back[k], v, rtol=1e-5, atol=1e-6) for k, v in codec.model.state_dict().items())


def test_any_other_dac_is_written_as_transformers_dacmodel_as_upstream_saves_it(parts, tmp_path) -> None:
    """The tests' tiny DAC (4 encoder channels, not descript's 64): written as parler's wrapper, upstream's
    from_pretrained met 279 size mismatches (it builds descript's sizes whatever config.json says)."""
    from voxrelay.codecs.dac import DacCodec

    config, ours = _export(parts, DacCodec.from_pretrained(str(TRANSFORMERS_DAC)), tmp_path / "up")
    theirs = load_file(str(TRANSFORMERS_DAC / "model.safetensors"))
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in theirs)
    upstream = json.loads((TRANSFORMERS_DAC / "config.json").read_text())["audio_encoder"]
    assert config["audio_encoder"] == {k: upstream[k] for k in config["audio_encoder"]}
    assert config["audio_encoder"]["model_type"] == "dac" and config["audio_encoder"]["encoder_hidden_size"] == 4
