"""Adapter over transformers' ``DacModel`` (Descript Audio Codec: 16, 24 or 44.1 kHz checkpoints), loaded from
transformers' layout, Parler-TTS' DAC wrapper (the hub's ``…/dac_44khZ_8kbps``) or a Parler-TTS model's own DAC.

DAC is a plain residual VQ at one rate, so codes are simply int64 [n_codebooks, T] with
``frame_rate = sampling_rate / hop_length`` (hop = prod(downsampling_ratios): 50 Hz for
``descript/dac_16khz``, 75 Hz for ``descript/dac_24khz``). Input is zero-padded to a multiple of
the hop, which is all DAC's feature extractor does for one mono clip.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from voxrelay.codecs.base import CodecError, CodecNotFoundError, describe_common, mono_float32
from voxrelay.codecs.dac_keys import (
    AUDIO,
    KeyMapError,
    dac_config_from_upstream,
    dac_state_from_upstream,
    is_descript_config,
)
from voxrelay.codecs.pretrained import CodecSource, read_config, resolve_folder
from voxrelay.errors import one_line
from voxrelay.hf_weights import WeightsFileError, read_weights

if TYPE_CHECKING:
    from transformers import DacModel


DAC_SOURCE = CodecSource("DAC", "DacModel.save_pretrained", "dac", "descript/dac_16khz",
                         "a DAC or of a model with a DAC audio_encoder")


def load_dac_model(path: str) -> DacModel:
    """A DacModel in eval mode from a local folder, a gs:// / s3:// folder or a hub id (owner/name) holding one of:

    - transformers' DacModel (``save_pretrained``: ``model_type`` "dac", ``n_codebooks``…), e.g. ``descript/dac_44khz``;
    - Parler-TTS' DAC wrapper (``DACModel``, descript's weight names ``model.encoder.block…`` with weight norm;
      ``model_type`` "dac" or, since transformers 4.45, "dac_on_the_hub"), e.g. the hub's ``…/dac_44khZ_8kbps``;
    - a model whose ``config.json`` has an ``audio_encoder`` DAC (a Parler-TTS checkpoint: the DAC it encodes with).
    The last two are converted to DacModel on load (:mod:`voxrelay.codecs.dac_keys`)."""
    folder = resolve_folder(path, DAC_SOURCE)
    config = read_config(folder, DAC_SOURCE)
    if config.get("model_type") == "dac" and not is_descript_config(config):
        return _transformers_dac(folder, path)
    if is_descript_config(config):
        return _converted_dac(folder, path, config, prefix="")
    audio = config.get("audio_encoder")
    if isinstance(audio, dict) and audio.get("model_type") in DAC_TYPES:
        return _converted_dac(folder, path, audio, prefix=AUDIO)
    raise CodecNotFoundError(
        f"{path!r} is not a DAC folder (config.json has model_type {config.get('model_type')!r}); set codec.path to "
        "a folder written by DacModel.save_pretrained (model_type 'dac'), Parler-TTS' DAC wrapper ('dac_on_the_hub') "
        "or a model with a DAC audio_encoder (a Parler-TTS model), or set codec.type to the codec that folder holds"
    )


DAC_TYPES = ("dac", "dac_on_the_hub")  # transformers' DacModel / Parler-TTS' wrapper (transformers <= 4.44: "dac")


def _transformers_dac(folder: Path, path: str) -> DacModel:
    from transformers import DacModel

    try:
        model = DacModel.from_pretrained(str(folder))
    except OSError as e:
        raise CodecNotFoundError(
            f"could not load DAC codec {path!r} as a local folder ({one_line(e)}); set codec.path to a folder "
            "written by DacModel.save_pretrained"
        ) from e
    except RuntimeError as e:  # weights whose shapes disagree with config.json
        raise CodecError(
            f"the weights in DAC folder {path!r} do not fit its config.json ({one_line(e)[:300]}); "
            "set codec.path to an intact folder written by DacModel.save_pretrained"
        ) from e
    return model.eval()


def _converted_dac(folder: Path, path: str, config: dict[str, Any], prefix: str) -> DacModel:
    """A DacModel from descript-named weights (``prefix`` "" for a DAC folder, "audio_encoder." for a model's)."""
    from transformers import DacModel

    fix = "set codec.path to an intact folder of Parler-TTS' DAC (…/dac_44khZ_8kbps) or of a Parler-TTS model"
    try:
        state = {k: v for k, v in read_weights(folder).items() if k.startswith(prefix)}
        converted = dac_state_from_upstream(state, prefix)
        with torch.device("meta"):
            model = DacModel(dac_config_from_upstream(config))
        model.load_state_dict(converted, strict=True, assign=True)
    except (WeightsFileError, KeyMapError, RuntimeError, TypeError, ValueError) as e:
        raise CodecError(f"the DAC weights in {path!r} cannot be loaded ({one_line(e)[:300]}); {fix}") from None
    return model.eval()


class DacCodec:
    """DAC as an :class:`~voxrelay.codecs.base.AudioCodec`; codes int64 [n_codebooks, ceil(N / hop)]."""

    name = "dac"

    def __init__(self, model: DacModel, path: str | None = None) -> None:
        self.model = model
        self.path = path
        self.sample_rate = int(model.config.sampling_rate)
        self.hop_length = int(np.prod(model.config.downsampling_ratios))
        self.frame_rate = self.sample_rate / self.hop_length
        self.num_codebooks = int(model.config.n_codebooks)
        self.codebook_size = int(model.config.codebook_size)

    @classmethod
    def from_pretrained(cls, path: str) -> DacCodec:
        """Load from a local folder (``save_pretrained``) or a hub id."""
        return cls(load_dac_model(path), path=path)

    @classmethod
    def from_model(cls, model: DacModel) -> DacCodec:
        """Wrap an already built DacModel (put in eval mode)."""
        return cls(model.eval(), path=None)

    def describe(self) -> dict[str, Any]:
        return describe_common(self, path=self.path, hop_length=self.hop_length)

    def encode(self, wav: np.ndarray) -> np.ndarray:
        """wav float32 [N] at ``sample_rate`` -> codes int64 [n_codebooks, ceil(N / hop_length)]."""
        return self.encode_batch([wav])[0]

    def encode_batch(self, wavs: list[np.ndarray]) -> list[np.ndarray]:
        """Clips encoded together, zero-padded to the longest (a multiple of the hop), on the model's device:
        codes int64 [n_codebooks, ceil(N_i / hop_length)] each. A shorter clip's last frames see the padding."""
        wavs = [mono_float32(w, "dac") for w in wavs]
        frames = [-(-w.size // self.hop_length) for w in wavs]
        x = np.zeros((len(wavs), 1, max(frames) * self.hop_length), dtype=np.float32)
        for i, w in enumerate(wavs):
            x[i, 0, : w.size] = w
        device = next(self.model.parameters()).device
        with torch.inference_mode():
            codes = self.model.encode(torch.from_numpy(x).to(device), return_dict=True).audio_codes  # [B, K, T]
        codes = codes.to(torch.int64).cpu().numpy()
        return [codes[i, :, :n] for i, n in enumerate(frames)]

    def to(self, device: str) -> DacCodec:
        """Move the model (prepare encodes on the GPU when there is one); returns self."""
        self.model.to(device)
        return self

    def decode(self, codes: np.ndarray) -> np.ndarray:
        """codes int [n_codebooks, T] -> wav float32 [T * hop_length] (deterministic)."""
        codes = np.asarray(codes)
        if codes.ndim != 2 or codes.shape[0] != self.num_codebooks:
            raise ValueError(f"dac: codes must be int [{self.num_codebooks}, T], got shape {codes.shape}")
        if codes.size and (codes.min() < 0 or codes.max() >= self.codebook_size):
            raise ValueError(f"dac: codes must lie in [0, {self.codebook_size}), got [{codes.min()}, {codes.max()}]")
        x = torch.from_numpy(codes.astype(np.int64))[None].to(next(self.model.parameters()).device)
        with torch.inference_mode():
            wav = self.model.decode(audio_codes=x, return_dict=True).audio_values  # [1, N]
        return wav.reshape(-1).float().cpu().numpy()
