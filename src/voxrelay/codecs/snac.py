"""Adapter over the ``snac`` package (multi-scale neural codec used by Orpheus-TTS).

SNAC quantises with one codebook per temporal rate: ``vq_strides`` such as [4, 2, 1] mean that
codebook i emits one code every ``vq_strides[i]`` latent frames. The adapter lays the codes out on
a grid at the coarsest rate, codebook-major:

    row 0                    codebook 0, its 1 code per coarse frame
    rows 1 .. 2              codebook 1, sub-steps 0 and 1 of the coarse frame
    rows 3 .. 6              codebook 2, sub-steps 0 .. 3
    (and so on for more codebooks: codebook i fills vq_strides[0] // vq_strides[i] rows)

so ``codes`` is int64 [K, T] with K = sum(vq_strides[0] // s) (7 for [4, 2, 1], 15 for
[8, 4, 2, 1]) and T the number of coarse frames: ``frame_rate = sample_rate / hop_length /
vq_strides[0]`` (about 11.7 Hz for ``hubertsiuzdak/snac_24khz``). Orpheus-TTS serialises the 7
codes of a frame in the time-interleaved order of rows [0, 1, 3, 4, 2, 5, 6].

Decoding is made deterministic (SNAC's decoder adds random noise) by running it under a forked,
fixed-seed torch RNG, which leaves the caller's RNG untouched.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from voxrelay.codecs.base import (
    CodecError,
    CodecNotFoundError,
    describe_common,
    looks_local,
    mono_float32,
)
from voxrelay.errors import one_line

if TYPE_CHECKING:
    import snac

_DECODE_SEED = 0


def _load_snac_state(folder: Path) -> dict[str, torch.Tensor]:
    """State dict from ``model.safetensors`` or ``pytorch_model.bin`` (tensors only, never pickled objects)."""
    if (folder / "model.safetensors").is_file():
        from safetensors.torch import load_file

        return load_file(folder / "model.safetensors")
    if (folder / "pytorch_model.bin").is_file():
        return torch.load(folder / "pytorch_model.bin", map_location="cpu", weights_only=True)
    raise CodecNotFoundError(
        f"SNAC folder {str(folder)!r} has no model.safetensors or pytorch_model.bin; "
        "point codec.path at a folder holding config.json and the weights (or at a hub id)"
    )


def _download(repo_id: str) -> Path:
    """Fetch config.json + pytorch_model.bin of a hub repo into the HF cache; returns the folder."""
    from huggingface_hub import hf_hub_download

    try:
        hf_hub_download(repo_id=repo_id, filename="config.json")
        return Path(hf_hub_download(repo_id=repo_id, filename="pytorch_model.bin")).parent
    except Exception as e:  # re-raised with the path and the fix, not swallowed
        raise CodecNotFoundError(
            f"could not load SNAC codec {repo_id!r}: it is not a local folder, so it was taken for a hub id, "
            f"and the hub download failed ({type(e).__name__}: {one_line(e)}); set codec.path to a local "
            "folder with config.json and weights, or to a hub id reachable from this machine"
        ) from e


def load_snac_model(path: str) -> snac.SNAC:
    """A SNAC model in eval mode from a local folder (config.json + weights) or a hub id (owner/name)."""
    from snac import SNAC

    folder = Path(path).expanduser()
    if not folder.is_dir():
        if looks_local(path):
            raise CodecNotFoundError(
                f"SNAC codec folder {path!r} does not exist; set codec.path to a local folder with "
                "config.json + pytorch_model.bin, or to a hub id such as 'hubertsiuzdak/snac_24khz'"
            )
        folder = _download(path)
    model = SNAC(**_read_snac_config(folder))
    try:
        model.load_state_dict(_load_snac_state(folder))
    except RuntimeError as e:  # missing/unexpected keys or shapes that disagree with config.json
        raise CodecError(
            f"the weights in SNAC folder {str(folder)!r} do not fit its config.json ({one_line(e)[:300]}); "
            "set codec.path to an intact SNAC folder (config.json and weights saved together)"
        ) from e
    return model.eval()


def _read_snac_config(folder: Path) -> dict[str, Any]:
    """The SNAC constructor arguments of ``folder/config.json``, checked to be a SNAC config."""
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise CodecNotFoundError(
            f"{str(folder)!r} is not a SNAC folder (no config.json); set codec.path to a local folder with "
            "config.json + pytorch_model.bin, or to a hub id such as 'hubertsiuzdak/snac_24khz'"
        )
    try:
        config = json.loads(config_file.read_text())
    except json.JSONDecodeError as e:
        raise CodecError(f"{config_file} is not valid JSON ({e}); restore the SNAC folder or download it again") from e
    from snac import SNAC

    known = set(inspect.signature(SNAC.__init__).parameters) - {"self"}
    unknown = sorted(set(config) - known) if isinstance(config, dict) else ["<not a mapping>"]
    if unknown:
        raise CodecError(
            f"{config_file} is not a SNAC config (unknown fields {unknown[:5]}); set codec.path to a SNAC "
            "folder, or set codec.type to the codec that folder holds"
        )
    return config


class SnacCodec:
    """SNAC as an :class:`~voxrelay.codecs.base.AudioCodec`; codes int64 [K, T] on the coarse grid above."""

    name = "snac"

    def __init__(self, model: snac.SNAC, path: str | None = None) -> None:
        self.model = model
        self.path = path
        self.strides = [int(s) for s in model.vq_strides]
        self.rows_per_codebook = [self.strides[0] // s for s in self.strides]
        self.sample_rate = int(model.sampling_rate)
        self.frame_rate = self.sample_rate / int(model.hop_length) / self.strides[0]
        self.num_codebooks = sum(self.rows_per_codebook)
        self.codebook_size = int(model.codebook_size)

    @classmethod
    def from_pretrained(cls, path: str) -> SnacCodec:
        """Load from a local folder (config.json + model.safetensors / pytorch_model.bin) or a hub id."""
        model = load_snac_model(path)
        codec = cls(model, path=path)
        codec.check_layout()
        return codec

    @classmethod
    def from_model(cls, model: snac.SNAC) -> SnacCodec:
        """Wrap an already built SNAC instance (put in eval mode)."""
        codec = cls(model.eval(), path=None)
        codec.check_layout()
        return codec

    def check_layout(self) -> None:
        """Raise if the strides cannot form the coarse grid (each must divide the first)."""
        if any(self.strides[0] % s for s in self.strides):
            raise ValueError(
                f"SNAC vq_strides {self.strides} cannot be laid out on a coarse grid: every stride must "
                "divide the first (e.g. [4, 2, 1] or [8, 4, 2, 1])"
            )

    def describe(self) -> dict[str, Any]:
        return describe_common(self, path=self.path, vq_strides=self.strides)

    def encode(self, wav: np.ndarray) -> np.ndarray:
        """wav float32 [N] at ``sample_rate`` -> codes int64 [K, T_coarse] (zero-padded to whole frames)."""
        wav = mono_float32(wav, "snac")
        x = torch.from_numpy(np.ascontiguousarray(wav))[None, None, :]
        with torch.inference_mode():
            per_codebook = self.model.encode(x)  # list of int64 [1, T_coarse * rows_i]
        rows = []
        for codes_i, n_rows in zip(per_codebook, self.rows_per_codebook, strict=True):
            # [T_coarse * n_rows] -> [T_coarse, n_rows] -> [n_rows, T_coarse]: row j = sub-step j
            rows.append(codes_i[0].reshape(-1, n_rows).T)
        return torch.cat(rows).to(torch.int64).numpy()

    def split_codes(self, codes: np.ndarray) -> list[torch.Tensor]:
        """Grid int [K, T_coarse] -> SNAC's list of int64 [1, T_coarse * rows_i] (inverse of the encode layout)."""
        codes = np.asarray(codes)
        if codes.ndim != 2 or codes.shape[0] != self.num_codebooks:
            raise ValueError(f"snac: codes must be int [{self.num_codebooks}, T], got shape {codes.shape}")
        if codes.size and (codes.min() < 0 or codes.max() >= self.codebook_size):
            raise ValueError(
                f"snac: codes must lie in [0, {self.codebook_size}), got [{codes.min()}, {codes.max()}]"
            )
        grid = torch.from_numpy(codes.astype(np.int64))
        out, start = [], 0
        for n_rows in self.rows_per_codebook:
            out.append(grid[start : start + n_rows].T.reshape(1, -1))
            start += n_rows
        return out

    def decode(self, codes: np.ndarray) -> np.ndarray:
        """codes int [K, T_coarse] -> wav float32 [T_coarse * vq_strides[0] * hop_length], deterministic."""
        per_codebook = self.split_codes(codes)
        with torch.random.fork_rng(devices=[]), torch.inference_mode():
            torch.manual_seed(_DECODE_SEED)
            wav = self.model.decode(per_codebook)
        return wav.reshape(-1).float().numpy()
