"""Adapter over transformers' ``DacModel`` (Descript Audio Codec: 16, 24 or 44.1 kHz checkpoints), loaded from
transformers' layout, Parler-TTS' DAC wrapper (the hub's ``…/dac_44khZ_8kbps``) or a Parler-TTS model's own DAC.

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

from voxrelay import storage
from voxrelay.codecs.base import CodecError, CodecNotFoundError, describe_common, looks_local, mono_float32
from voxrelay.codecs.dac_keys import (
    AUDIO,
    KeyMapError,
    dac_config_from_upstream,
    dac_state_from_upstream,
    is_descript_config,
)
from voxrelay.errors import one_line
from voxrelay.hf_weights import WeightsFileError, has_weights, read_weights
from voxrelay.paths import cache_dir, uri_key

if TYPE_CHECKING:
    from transformers import DacModel


def load_dac_model(path: str) -> DacModel:
    """A DacModel in eval mode from a local folder or a hub id (owner/name) holding one of:

    - transformers' DacModel (``save_pretrained``: ``model_type`` "dac", ``n_codebooks``…), e.g. ``descript/dac_44khz``;
    - Parler-TTS' DAC wrapper (``DACModel``, descript's weight names ``model.encoder.block…`` with weight norm;
      ``model_type`` "dac" or, since transformers 4.45, "dac_on_the_hub"), e.g. the hub's ``…/dac_44khZ_8kbps``;
    - a model whose ``config.json`` has an ``audio_encoder`` DAC (a Parler-TTS checkpoint: the DAC it encodes with).
    The last two are converted to DacModel on load (:mod:`voxrelay.codecs.dac_keys`)."""
    if "://" in path and not storage.is_local(path):
        path = str(_from_bucket(path))
    local = Path(path).expanduser()
    if not local.is_dir() and looks_local(path):
        raise CodecNotFoundError(
            f"DAC codec folder {path!r} does not exist; set codec.path to a local folder written by "
            "DacModel.save_pretrained, or to a hub id such as 'descript/dac_16khz'"
        )
    folder = local if local.is_dir() else _hub_snapshot(path)
    config = _read_config(folder)
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


def _from_bucket(uri: str) -> Path:
    """A copy of the config and weights directly under ``uri`` (gs://, s3://; e.g. the Parler model folder an
    imported config names) in the cache ``model.init_from`` uses too, fetched once (same-size files are kept)."""
    local = cache_dir("init_from", uri_key(uri))
    sizes = {n: s for n, s in storage.file_sizes(uri).items() if n.endswith((".json", ".safetensors", ".bin"))}
    if "config.json" not in sizes:
        raise CodecNotFoundError(f"codec.path {uri!r} holds no config.json; give the folder of a DAC or of a model "
                                 "with a DAC audio_encoder")
    for name, size in sizes.items():
        target = storage.checked_join(local, name, f"the listing of {uri}", single=True)
        if not (target.is_file() and target.stat().st_size == size):
            storage.get_file(storage.join(uri, name), target)
    return local


def _hub_snapshot(hub_id: str) -> Path:
    """The hub repo's config and weights (safetensors, else the pickle) in the local hub cache."""
    from huggingface_hub import snapshot_download

    try:
        folder = Path(snapshot_download(hub_id, allow_patterns=["*.json", "*.safetensors"]))
        return folder if has_weights(folder) else Path(snapshot_download(hub_id, allow_patterns=["*.json", "*.bin"]))
    except Exception as e:  # the hub client's errors have no common base worth naming
        raise CodecNotFoundError(
            f"could not load DAC codec {hub_id!r} as a hub id (it is not a local folder) ({one_line(e)[:200]}); set "
            "codec.path to a local folder written by DacModel.save_pretrained (hub ids need network access or a "
            "warm HF cache)"
        ) from None


def _read_config(folder: Path) -> dict[str, Any]:
    """config.json of a local folder; refused when absent (transformers would build a random model)."""
    try:
        config = json.loads((folder / "config.json").read_text())
    except FileNotFoundError:
        problem = "no config.json"
    except (json.JSONDecodeError, UnicodeDecodeError):
        problem = "config.json is not a JSON object"
    else:
        if isinstance(config, dict):
            return config
        problem = "config.json is not a JSON object"
    raise CodecNotFoundError(
        f"{str(folder)!r} is not a DAC folder ({problem}); set codec.path to a folder written by "
        "DacModel.save_pretrained (model_type 'dac'), or set codec.type to the codec that folder holds"
    )


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
