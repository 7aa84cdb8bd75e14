"""UTMOS: the predicted naturalness MOS (1-5) of each eval sample, ``eval/utmos`` (the "UTMOS" column of F5-TTS'
and other papers' tables).

The model is UTMOS22's "strong learner" (Saeki et al. 2022, sarulab-speech/UTMOS22, MIT) without its phoneme
encoder, as tarepan/SpeechMOS ships it for ``torch.hub``: wav2vec 2.0 base over 16 kHz audio, each frame joined
with the learned domain and listener embeddings, a BLSTM (512 per direction), Linear 1024->2048, ReLU, Linear->1,
averaged over frames, times 2 plus 3. The wav2vec 2.0 part is transformers' ``Wav2Vec2Model``, whose layers are
fairseq's (the one that UTMOS22 trained on); its weights are renamed from SpeechMOS' names as they load.

Weights: SpeechMOS' ``utmos22_strong_step7459_v1.pt`` (converted from UTMOS22's checkpoint; a state dict of plain
tensors, read with ``torch.load(weights_only=True)``: no code in it runs), downloaded once into torch's hub cache
(``$TORCH_HOME/hub/checkpoints``: where SpeechMOS' own ``torch.hub.load`` puts it) or read from a file or URL the
config names (``eval.utmos``). Checked against SpeechMOS' own module (``scripts/utmos_upstream.py``).

Audio is resampled to 16 kHz with soxr (SpeechMOS uses torchaudio's sinc resampler; at 16 kHz both do nothing).
"""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

import numpy as np
import torch
from torch import nn

from voxrelay.data.audio import resample
from voxrelay.errors import UserError

SAMPLE_RATE = 16_000
WEIGHTS_URL = "https://github.com/tarepan/SpeechMOS/releases/download/v1.0.0/utmos22_strong_step7459_v1.pt"
SSL, EMBED, RNN, PROJ = 768, 128, 512, 2048

# SpeechMOS (fairseq) names -> transformers' Wav2Vec2Model names, under the same "wav2vec2." prefix
_RENAMES = [
    (r"feature_extractor\.conv_layers\.(\d+)\.0\.weight", r"feature_extractor.conv_layers.\1.conv.weight"),
    (r"feature_extractor\.conv_layers\.0\.2\.", "feature_extractor.conv_layers.0.layer_norm."),
    (r"layer_norm\.", "feature_projection.layer_norm."),
    (r"post_extract_proj\.", "feature_projection.projection."),
    (r"mask_emb", "masked_spec_embed"),
    (r"encoder\.pos_conv\.0\.(weight_g|parametrizations\.weight\.original0)",
     "encoder.pos_conv_embed.conv.parametrizations.weight.original0"),
    (r"encoder\.pos_conv\.0\.(weight_v|parametrizations\.weight\.original1)",
     "encoder.pos_conv_embed.conv.parametrizations.weight.original1"),
    (r"encoder\.pos_conv\.0\.bias", "encoder.pos_conv_embed.conv.bias"),
    (r"encoder\.layers\.(\d+)\.self_attn\.", r"encoder.layers.\1.attention."),
    (r"encoder\.layers\.(\d+)\.self_attn_layer_norm\.", r"encoder.layers.\1.layer_norm."),
    (r"encoder\.layers\.(\d+)\.fc1\.", r"encoder.layers.\1.feed_forward.intermediate_dense."),
    (r"encoder\.layers\.(\d+)\.fc2\.", r"encoder.layers.\1.feed_forward.output_dense."),
    (r"encoder\.(layer_norm|layers\.\d+\.final_layer_norm)\.", r"encoder.\1."),
]


class UtmosWeightsError(UserError, ValueError):
    """The ``eval.utmos`` weights cannot be read or are not UTMOS22 strong's."""


def wav2vec2_config(layers: int = 12):
    """wav2vec 2.0 base as fairseq built it for UTMOS22 (group norm in the first conv only, no conv bias, post-norm
    layers, exact GELU)."""
    from transformers import Wav2Vec2Config

    return Wav2Vec2Config(
        hidden_size=SSL, num_hidden_layers=layers, num_attention_heads=12, intermediate_size=3072, hidden_act="gelu",
        feat_extract_norm="group", feat_extract_activation="gelu", conv_bias=False, do_stable_layer_norm=False,
        conv_dim=(512,) * 7, conv_kernel=(10, 3, 3, 3, 3, 2, 2), conv_stride=(5, 2, 2, 2, 2, 2, 2),
        num_conv_pos_embeddings=128, num_conv_pos_embedding_groups=16, apply_spec_augment=False,
        hidden_dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, feat_proj_dropout=0.0, layerdrop=0.0,
    )


class Utmos(nn.Module):
    def __init__(self, layers: int = 12):
        super().__init__()
        from transformers import Wav2Vec2Model

        self.wav2vec2 = Wav2Vec2Model(wav2vec2_config(layers))
        self.domain_emb = nn.Parameter(torch.zeros(1, EMBED), requires_grad=False)
        self.judge_emb = nn.Parameter(torch.zeros(1, EMBED), requires_grad=False)
        self.blstm = nn.LSTM(SSL + 2 * EMBED, RNN, batch_first=True, bidirectional=True)
        self.projection = nn.Sequential(nn.Linear(2 * RNN, PROJ), nn.ReLU(), nn.Linear(PROJ, 1))

    def forward(self, wave: torch.Tensor) -> torch.Tensor:
        """[B, T] at 16 kHz -> [B] predicted MOS."""
        frames = self.wav2vec2(wave).last_hidden_state
        b, n, _ = frames.shape
        joined = torch.cat([frames, self.domain_emb.expand(b, n, -1), self.judge_emb.expand(b, n, -1)], dim=2)
        return self.projection(self.blstm(joined)[0]).mean(dim=1).squeeze(1) * 2 + 3


def rename(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """SpeechMOS' state dict in this module's names (names already in them pass through)."""
    out = {}
    for key, value in state.items():
        if key.startswith("wav2vec2."):
            inner = key[len("wav2vec2."):]
            for pattern, repl in _RENAMES:
                new, hits = re.subn(f"^{pattern}", repl, inner)
                if hits:
                    inner = new
                    break
            key = "wav2vec2." + inner
        out[key] = value
    return out


def read_state(source: str) -> tuple[dict[str, torch.Tensor], str]:
    """(the state dict, its file name) from a local file or a URL (downloaded once into torch's hub cache)."""
    from voxrelay.hf_weights import WeightsFileError, read_file

    if re.match(r"^https?://", source):
        try:
            state = torch.hub.load_state_dict_from_url(source, map_location="cpu", weights_only=True,
                                                       check_hash=False, progress=False)
        except Exception as err:  # noqa: BLE001 (no network, a refused pickle: one message with the fix)
            raise UtmosWeightsError(
                f"eval.utmos: could not fetch {source} ({type(err).__name__}: {str(err)[:200]}); download it where "
                "there is a network and set eval.utmos to the file's path") from None
        return dict(state), source.rsplit("/", 1)[-1]
    path = Path(source).expanduser()
    if not path.is_file():
        raise UtmosWeightsError(f"eval.utmos: {source} is not a file; give the path of "
                                f"utmos22_strong_step7459_v1.pt (from {WEIGHTS_URL}) or true to download it")
    try:
        return read_file(path), path.name
    except WeightsFileError as err:
        raise UtmosWeightsError(f"eval.utmos: {err}") from None


def _no_init():
    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # another transformers: initialised, then overwritten
        return contextlib.nullcontext()
    return no_init_weights()


class UtmosScorer:
    """UTMOS22 strong with its weights, scoring one clip at a time (clips are never padded together: padding
    would change the first conv layer's group norm)."""

    def __init__(self, net: Utmos, name: str, device: torch.device):
        self.net = net
        self.name = name
        self.device = device

    @classmethod
    def load(cls, source: str | bool, device: str | torch.device = "cpu") -> UtmosScorer:
        state, name = read_state(WEIGHTS_URL if source is True else str(source))
        state = rename(state)
        found = {int(m.group(1)) for k in state if (m := re.match(r"wav2vec2\.encoder\.layers\.(\d+)\.", k))}
        with _no_init():  # every tensor comes from the file (checked below): random init would only cost seconds
            net = Utmos(layers=max(found) + 1 if found else 12)
        missing, unexpected = net.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise UtmosWeightsError(
                f"eval.utmos: {name} is not UTMOS22 strong's state dict (missing {sorted(missing)[:3]}, unexpected "
                f"{sorted(unexpected)[:3]}); give SpeechMOS' utmos22_strong_step7459_v1.pt ({WEIGHTS_URL})")
        return cls(net.eval().to(device), name, torch.device(device))

    def describe(self) -> str:
        return f"UTMOS22 strong ({self.name})"

    @torch.inference_mode()
    def score(self, wav: np.ndarray, sample_rate: int) -> float:
        wave = resample(np.asarray(wav, dtype=np.float32), sample_rate, SAMPLE_RATE)
        if len(wave) < 400:  # shorter than the first conv's 25 ms window: no frame to score
            wave = np.pad(wave, (0, 400 - len(wave)))
        return float(self.net(torch.from_numpy(wave)[None].to(self.device))[0])
