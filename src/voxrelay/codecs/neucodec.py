"""Adapter over transformers' ``NeuCodecModel`` (NeuTTS Air's codec, hub id ``neuphonic/neucodec``).

NeuCodec is XCodec2 (:mod:`voxrelay.codecs.xcodec2`) with a decoder at another rate: it encodes 16 kHz audio at
50 Hz into one finite-scalar codebook of 65,536 entries and decodes to 24 kHz (hop 480 there).

Rates: ``sample_rate`` is 24 kHz, the decoder's, and ``encode`` takes audio at that rate too and resamples it to
16 kHz (soxr, high quality) before encoding, so the AudioCodec contract holds as it is: ``prepare`` loads clips
at ``codec.sample_rate``, and every caller that labels ``decode``'s output with ``codec.sample_rate`` (synthesis,
evaluation) gets 24 kHz audio labelled 24 kHz. ``encoder_sample_rate`` (16 kHz) names the encoder's own rate,
and ``encode_native`` takes audio already at it (NeuTTS loads its reference clips at 16 kHz).

Codes: int64 [1, T] with ``T = N16 // 320`` for N16 samples at 16 kHz (``N // 480`` at 24 kHz), measured through
transformers' extractor on a random-init model: the extractor appends one zero sample and pads to a multiple of
320, like XCodec2's, but computes its mel frames without centring them, so the semantic branch has one frame
fewer and the encoder trims the acoustic one to it (93,760 samples at 16 kHz give 293 codes). The extractor
refuses clips under 320 samples (20 ms); such a clip is zero-padded to 320 here (one code). Decoding T codes
gives T * 480 samples at 24 kHz.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import soxr

from voxrelay.codecs.base import describe_common, mono_float32
from voxrelay.codecs.pretrained import CodecSource
from voxrelay.codecs.xcodec2 import Xcodec2Codec

if TYPE_CHECKING:
    from transformers import PreTrainedModel

NEUCODEC_SOURCE = CodecSource("NeuCodec", "NeuCodecModel.save_pretrained", "neucodec", "neuphonic/neucodec",
                              "a NeuCodec model (NeuCodecModel.save_pretrained)")


class NeuCodecCodec(Xcodec2Codec):
    """NeuCodec as an :class:`~voxrelay.codecs.base.AudioCodec`: float32 [N] at 24 kHz -> codes int64 [1, N // 480]
    -> float32 [T * 480] at 24 kHz."""

    name = "neucodec"
    source: ClassVar[CodecSource] = NEUCODEC_SOURCE
    model_class: ClassVar[str] = "NeuCodecModel"
    centered: ClassVar[bool] = False
    min_samples: ClassVar[int] = 320  # one code at 16 kHz: the extractor's fbank needs a 400-sample window

    def __init__(self, model: PreTrainedModel, path: str | None = None) -> None:
        self.model = model
        self.path = path
        self.sample_rate = int(model.config.output_sampling_rate)
        self.hop_length = int(model.config.hop_length)  # at sample_rate: 480
        self.encoder_sample_rate = int(model.config.input_sampling_rate)
        self.encoder_hop_length = int(model.config.encoder_hop_length)  # at encoder_sample_rate: 320
        self.frame_rate = self.encoder_sample_rate / self.encoder_hop_length
        self.num_codebooks = 1
        self.codebook_size = int(np.prod(model.config.quantization_levels))

    def describe(self) -> dict[str, Any]:
        return describe_common(self, path=self.path, hop_length=self.hop_length,
                               encoder_sample_rate=self.encoder_sample_rate,
                               encoder_hop_length=self.encoder_hop_length)

    def encode(self, wav: np.ndarray) -> np.ndarray:
        """wav float32 [N] at ``sample_rate`` (24 kHz) -> codes int64 [1, max(N // 480, 1)] (via 16 kHz)."""
        wav = mono_float32(wav, self.name)
        if self.sample_rate != self.encoder_sample_rate:
            wav = soxr.resample(wav, self.sample_rate, self.encoder_sample_rate, quality="HQ").astype(np.float32)
        return self.encode_native(wav)
