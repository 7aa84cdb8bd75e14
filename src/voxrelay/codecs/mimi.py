"""Adapter over transformers' ``MimiModel`` (Kyutai's Mimi, the codec of Moshi and Sesame CSM; hub id ``kyutai/mimi``).

Mimi encodes 24 kHz mono audio at 12.5 frames/s (1920 samples per frame) with a split residual VQ: one semantic
codebook, then up to 31 acoustic ones, 2048 entries each. ``codec.num_codebooks`` keeps the first K quantizers
(CSM: all 32; Moshi: 8); fewer codebooks are a coarser residual of the same encoding, not another one.

Codes: int64 [K, T] with ``T = ceil(N / 1920)`` for N samples: the causal encoder pads the last partial frame
itself (measured on a tiny model with Mimi's default ratios: 1 and 1920 samples give 1 code, 1921 give 2, 24,000
give 13; the real model gives the same, notes/csm_spike.md point 4). No feature extractor is needed: for one mono
clip transformers' (Encodec's) extractor only adds the batch and channel axes. Decoding T codes gives T * 1920
samples at 24 kHz.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from voxrelay.codecs.base import CodecError, describe_common, mono_float32
from voxrelay.codecs.pretrained import CodecSource, load_codec_model

if TYPE_CHECKING:
    from transformers import MimiModel

MIMI_SOURCE = CodecSource("Mimi", "MimiModel.save_pretrained", "mimi", "kyutai/mimi",
                          "a Mimi model (MimiModel.save_pretrained)")


def kept_codebooks(model: MimiModel, num_codebooks: int | None, path: str | None) -> int:
    """``num_codebooks`` (None: all of the model's quantizers), refused unless the model has that many."""
    total = int(model.config.num_quantizers)
    semantic = int(model.config.num_semantic_quantizers)
    if num_codebooks is None:
        return total
    if not semantic <= num_codebooks <= total:
        raise CodecError(
            f"codec.num_codebooks is {num_codebooks}, but the Mimi model {path!r} has {total} quantizers (the first "
            f"{semantic} semantic); set codec.num_codebooks between {semantic} and {total} (CSM uses 32, Moshi 8)"
        )
    return num_codebooks


class MimiCodec:
    """Mimi as an :class:`~voxrelay.codecs.base.AudioCodec`: float32 [N] at 24 kHz -> codes int64
    [num_codebooks, ceil(N / 1920)] -> float32 [T * 1920] at 24 kHz."""

    name = "mimi"
    source = MIMI_SOURCE

    def __init__(self, model: MimiModel, num_codebooks: int, path: str | None = None) -> None:
        self.model = model
        self.path = path
        self.sample_rate = int(model.config.sampling_rate)
        # the encoder's stride: its SEANet ratios, then the downsampling to frame_rate (MimiEncoderModel)
        self.hop_length = int(np.prod(model.config.upsampling_ratios)) * int(model.config.latent_stride)
        self.frame_rate = self.sample_rate / self.hop_length
        self.num_codebooks = num_codebooks
        self.codebook_size = int(model.config.codebook_size)

    @classmethod
    def from_pretrained(cls, path: str, num_codebooks: int | None = None) -> MimiCodec:
        """Load from a local folder (``save_pretrained``), a gs:// / s3:// folder or a hub id, keeping the first
        ``num_codebooks`` quantizers (None: all)."""
        model = load_codec_model(path, cls.source, "MimiModel")
        return cls(model, kept_codebooks(model, num_codebooks, path), path=path)

    @classmethod
    def from_model(cls, model: MimiModel, num_codebooks: int | None = None) -> MimiCodec:
        """Wrap an already built MimiModel (put in eval mode)."""
        return cls(model.eval(), kept_codebooks(model, num_codebooks, None), path=None)

    def describe(self) -> dict[str, Any]:
        return describe_common(self, path=self.path, hop_length=self.hop_length)

    def to(self, device: str) -> MimiCodec:
        """Move the model (prepare encodes on the GPU when there is one); returns self."""
        self.model.to(device)
        for module in self.model.modules():  # the codebooks cache embed_sum / usage in a plain attribute,
            if hasattr(module, "embed_sum") and hasattr(module, "_embed"):  # which .to() would leave behind
                module._embed = None
        return self

    def encode(self, wav: np.ndarray) -> np.ndarray:
        """wav float32 [N] at ``sample_rate`` (24 kHz) -> codes int64 [num_codebooks, ceil(N / 1920)], deterministic."""
        wav = mono_float32(wav, self.name)
        x = torch.from_numpy(wav)[None, None].to(next(self.model.parameters()).device)  # [1, 1, N]
        with torch.inference_mode():
            codes = self.model.encode(x, num_quantizers=self.num_codebooks, return_dict=True).audio_codes  # [1, K, T]
        return codes[0].to(torch.int64).cpu().numpy()

    def decode(self, codes: np.ndarray) -> np.ndarray:
        """codes int [num_codebooks, T] -> wav float32 [T * hop_length] at ``sample_rate``, deterministic."""
        codes = np.asarray(codes)
        if codes.ndim != 2 or codes.shape[0] != self.num_codebooks:
            raise ValueError(f"{self.name}: codes must be int [{self.num_codebooks}, T], got shape {codes.shape}")
        if codes.size and (codes.min() < 0 or codes.max() >= self.codebook_size):
            raise ValueError(
                f"{self.name}: codes must lie in [0, {self.codebook_size}), got [{codes.min()}, {codes.max()}]"
            )
        if codes.shape[1] == 0:
            return np.zeros(0, dtype=np.float32)
        x = torch.from_numpy(codes.astype(np.int64))[None].to(next(self.model.parameters()).device)  # [1, K, T]
        with torch.inference_mode():
            wav = self.model.decode(audio_codes=x, return_dict=True).audio_values  # [1, 1, T * hop]
        return wav.reshape(-1).float().cpu().numpy()
