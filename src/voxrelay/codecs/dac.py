"""Adapter over transformers' ``DacModel`` (Descript Audio Codec: 16, 24 or 44.1 kHz checkpoints).

DAC is a plain residual VQ at one rate, so codes are simply int64 [n_codebooks, T] with
``frame_rate = sampling_rate / hop_length`` (hop = prod(downsampling_ratios): 50 Hz for
``descript/dac_16khz``, 75 Hz for ``descript/dac_24khz``). Input is zero-padded to a multiple of
the hop, which is all DAC's feature extractor does for one mono clip.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from voxrelay.codecs.base import CodecError, CodecNotFoundError, describe_common, looks_local, mono_float32
from voxrelay.errors import one_line

if TYPE_CHECKING:
    from transformers import DacModel


def load_dac_model(path: str) -> DacModel:
    """A DacModel in eval mode from a local ``save_pretrained`` folder or a hub id (owner/name)."""
    from transformers import DacModel

    local = Path(path).expanduser()
    if not local.is_dir() and looks_local(path):
        raise CodecNotFoundError(
            f"DAC codec folder {path!r} does not exist; set codec.path to a local folder written by "
            "DacModel.save_pretrained, or to a hub id such as 'descript/dac_16khz'"
        )
    if local.is_dir():
        _check_dac_folder(local)
    source = str(local) if local.is_dir() else path
    try:
        model = DacModel.from_pretrained(source)
    except OSError as e:
        where = "local folder" if local.is_dir() else "hub id (it is not a local folder)"
        raise CodecNotFoundError(
            f"could not load DAC codec {path!r} as a {where} ({one_line(e)}); set codec.path to a local "
            "folder written by DacModel.save_pretrained (hub ids need network access or a warm HF cache)"
        ) from e
    except RuntimeError as e:  # weights whose shapes disagree with config.json
        raise CodecError(
            f"the weights in DAC folder {path!r} do not fit its config.json ({one_line(e)[:300]}); "
            "set codec.path to an intact folder written by DacModel.save_pretrained"
        ) from e
    return model.eval()


def _check_dac_folder(folder: Path) -> None:
    """Refuse a local folder that holds no DAC config: transformers would build a random model from it."""
    config_file = folder / "config.json"
    try:
        model_type = json.loads(config_file.read_text()).get("model_type")
    except FileNotFoundError:
        model_type = None
        problem = "no config.json"
    except (json.JSONDecodeError, AttributeError):
        model_type = None
        problem = "config.json is not a JSON object"
    else:
        problem = f"config.json has model_type {model_type!r}"
    if model_type != "dac":
        raise CodecNotFoundError(
            f"{str(folder)!r} is not a DAC folder ({problem}); set codec.path to a folder written by "
            "DacModel.save_pretrained (model_type 'dac'), or set codec.type to the codec that folder holds"
        )


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
