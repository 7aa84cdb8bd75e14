"""Adapter over transformers' ``Xcodec2Model`` (Llasa's codec, hub id ``HKUSTAudio/xcodec2-hf``).

XCodec2 encodes 16 kHz mono audio at 50 Hz (hop 320) into one finite-scalar codebook of 65,536 entries (8 levels
of 4): codes int64 [1, T] with ``T = N // 320 + 1`` for N samples, because transformers' feature extractor
appends one zero sample and pads to a multiple of the hop (measured on a random-init model through the extractor:
93,760 samples = 293 hops give 294 codes; 93,440 to 93,759 give 293). Decoding T codes gives T * 320 samples
at 16 kHz (a Vocos ISTFT head with "same" padding).

The encoder reads the padded waveform (acoustic branch) and stacked log-mels of it (semantic branch, a
w2v-BERT 2.0 encoder); :mod:`voxrelay.codecs.xcodec_features` computes both as the extractor does, without
torchaudio. NeuCodec, XCodec2's descendant, shares all of it but its rates (:mod:`voxrelay.codecs.neucodec`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch

from voxrelay.codecs import xcodec_features as features
from voxrelay.codecs.base import CodecError, describe_common, mono_float32
from voxrelay.codecs.pretrained import CodecSource, load_codec_model

if TYPE_CHECKING:
    from transformers import PreTrainedModel

XCODEC2_SOURCE = CodecSource("XCodec2", "Xcodec2Model.save_pretrained", "xcodec2", "HKUSTAudio/xcodec2-hf",
                             "an XCodec2 model (Xcodec2Model.save_pretrained)")


_TRAINING_ONLY = ("masked_spec_embed",)  # w2v-BERT's SpecAugment vector: never read by encode or decode


class Xcodec2Codec:
    """XCodec2 as an :class:`~voxrelay.codecs.base.AudioCodec`: float32 [N] at 16 kHz -> int64 [1, N // 320 + 1]."""

    name = "xcodec2"
    source: ClassVar[CodecSource] = XCODEC2_SOURCE
    model_class: ClassVar[str] = "Xcodec2Model"
    stored_dtype: ClassVar[str] = "int32"  # 65,536 codes: more than int16 holds (voxrelay.data.shards)
    centered: ClassVar[bool] = True  # the semantic input's padding (xcodec_features.semantic_input)
    min_samples: ClassVar[int] = 1  # at encoder_sample_rate

    def __init__(self, model: PreTrainedModel, path: str | None = None) -> None:
        self.model = model
        self.path = path
        self.sample_rate = int(model.config.sampling_rate)
        self.hop_length = int(model.config.hop_length)
        self.encoder_sample_rate = self.sample_rate
        self.encoder_hop_length = self.hop_length
        self.frame_rate = self.sample_rate / self.hop_length
        self.num_codebooks = 1
        self.codebook_size = int(np.prod(model.config.quantization_levels))

    @classmethod
    def from_pretrained(cls, path: str) -> Xcodec2Codec:
        """Load from a local folder (``save_pretrained``), a gs:// / s3:// folder or a hub id."""
        codec = cls(load_codec_model(path, cls.source, cls.model_class, _TRAINING_ONLY), path=path)
        codec.check_layout()
        return codec

    @classmethod
    def from_model(cls, model: PreTrainedModel) -> Xcodec2Codec:
        """Wrap an already built model (put in eval mode)."""
        codec = cls(model.eval(), path=None)
        codec.check_layout()
        return codec

    def check_layout(self) -> None:
        """Raise unless the encoder runs at 16 kHz with hop 320: the semantic branch's mel frames are fixed at
        160 samples, two per code, so another hop would give the two branches different lengths."""
        if (self.encoder_sample_rate, self.encoder_hop_length) != (features.SAMPLE_RATE, features.HOP):
            raise CodecError(
                f"{self.name} codec {self.path!r} encodes {self.encoder_sample_rate} Hz audio with hop "
                f"{self.encoder_hop_length}; voxrelay computes its semantic features for 16000 Hz and hop 320 only "
                "(the released models); set codec.path to such a model"
            )

    def describe(self) -> dict[str, Any]:
        return describe_common(self, path=self.path, hop_length=self.hop_length)

    def to(self, device: str) -> Xcodec2Codec:
        """Move the model (prepare encodes on the GPU when there is one); returns self."""
        self.model.to(device)
        return self

    def encode(self, wav: np.ndarray) -> np.ndarray:
        """wav float32 [N] at ``sample_rate`` (16 kHz) -> codes int64 [1, N // 320 + 1]."""
        return self.encode_native(mono_float32(wav, self.name))

    def encode_native(self, wav: np.ndarray) -> np.ndarray:
        """wav float32 [N] at ``encoder_sample_rate`` (16 kHz) -> codes int64 [1, T], deterministic."""
        wav = mono_float32(wav, self.name)
        if wav.size < self.min_samples:
            wav = np.pad(wav, (0, self.min_samples - wav.size))
        acoustic = features.acoustic_input(wav)
        semantic = features.semantic_input(acoustic, self.centered)
        device = next(self.model.parameters()).device
        mask = torch.ones(semantic.shape[:2], dtype=torch.int32, device=device)  # what the extractor passes
        with torch.inference_mode():
            out = self.model.encode(acoustic.to(device), input_features=semantic.to(device),
                                    input_features_mask=mask, return_dict=True)
        return out.audio_codes[0].to(torch.int64).cpu().numpy()  # [1, 1, T] int32 -> [1, T]

    def decode(self, codes: np.ndarray) -> np.ndarray:
        """codes int [1, T] -> wav float32 [T * hop_length] at ``sample_rate``, deterministic."""
        codes = np.asarray(codes)
        if codes.ndim != 2 or codes.shape[0] != 1:
            raise ValueError(f"{self.name}: codes must be int [1, T], got shape {codes.shape}")
        if codes.size and (codes.min() < 0 or codes.max() >= self.codebook_size):
            raise ValueError(
                f"{self.name}: codes must lie in [0, {self.codebook_size}), got [{codes.min()}, {codes.max()}]"
            )
        if codes.shape[1] == 0:
            return np.zeros(0, dtype=np.float32)
        x = torch.from_numpy(codes.astype(np.int64))[None].to(next(self.model.parameters()).device)  # [1, 1, T]
        with torch.inference_mode():
            wav = self.model.decode(audio_codes=x, return_dict=True).audio_values  # [1, 1, T * hop]
        return wav.reshape(-1).float().cpu().numpy()
