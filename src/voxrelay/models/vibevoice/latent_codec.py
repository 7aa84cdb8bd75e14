"""``codec.type: vibevoice_latents`` (the family's own codec, ``FamilySpec.codecs``): VibeVoice's frozen encoders'
outputs, computed once by ``prepare`` instead of at every training session (``codec.type: pcm`` stores the audio
and the family encodes it at train time).

A row's stored array is float32 ``[Da + Ds, T]``: per latent (one per ``hop_length`` samples at 24 kHz, 7.5 per
second), the σ-VAE's means (``Da`` values, before its sampling noise and the model's scaling) then the semantic
encoder's features (``Ds``). Each clip is encoded alone exactly as training encodes it from stored audio (16-bit
PCM, normalised to -25 dBFS, zero-padded to whole latents), so a run on these latents trains as a run on the audio.

``codec.path`` names the VibeVoice checkpoint (transformers' layout: a folder or hub id, or a voxrelay export)
whose encoders make the latents; only those weights are read (``model.audio_tower.*``,
``model.semantic_tokenizer_encoder.*``). The data records their digest (``encoders_sha256``): training refuses
data made by other encoders. ``decode`` turns stored means back into audio with the σ-VAE's decoder (voice
prompts at eval). Rebuilt from a prepared ``index.json``, the codec loads its weights only when it is used.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

from voxrelay.codecs.base import CodecError, CodecNotFoundError, describe_common, looks_local, mono_float32

NAME = "vibevoice_latents"
SAMPLE_RATE = 24000
PCM_SCALE = 32767.0
PREFIXES = {"acoustic": "model.audio_tower.", "semantic": "model.semantic_tokenizer_encoder."}


def normalize(wav: np.ndarray, target_dbfs: float = -25.0, eps: float = 1e-6) -> np.ndarray:
    """RMS to ``target_dbfs``, then peaks above 1 scaled down (VibeVoiceAcousticTokenizerFeatureExtractor's)."""
    wav = np.asarray(wav, dtype=np.float32).reshape(-1)
    wav = wav * (10 ** (target_dbfs / 20) / (float(np.sqrt(np.mean(wav ** 2))) + eps))
    peak = float(np.abs(wav).max()) if wav.size else 0.0
    return (wav / (peak + eps) if peak > 1.0 else wav).astype(np.float32)


def pcm16_normalized(samples: np.ndarray) -> np.ndarray:
    """Samples stored as 16-bit PCM (int [N] or [1, N]) as VibeVoice's feature extractor gives them."""
    return normalize(np.asarray(samples, dtype=np.float32).reshape(-1) / PCM_SCALE)


def encoders_digest(acoustic_encoder: Any, semantic_encoder: Any) -> str:
    """sha256 of the two encoders' weights (names, shapes and values rounded to bfloat16, so a model loaded in
    another dtype has the same digest): what decides whether stored latents fit a model."""
    import torch

    digest = hashlib.sha256()
    for part, module in (("acoustic", acoustic_encoder), ("semantic", semantic_encoder)):
        for name, tensor in sorted(module.state_dict().items()):
            value = tensor.detach().to("cpu", torch.bfloat16).contiguous().view(torch.int16)
            digest.update(f"{part}.{name}:{tuple(tensor.shape)}".encode())
            digest.update(value.numpy().tobytes())
    return digest.hexdigest()


def _folder(path: str) -> Path:
    folder = Path(path).expanduser()
    if folder.is_dir():
        return folder
    if looks_local(path):
        raise CodecNotFoundError(f"codec.path={path!r}: no such folder (and not a hub id); point it at the VibeVoice "
                                 "checkpoint you train (model.init_from)")
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(path, allow_patterns=["config.json", "*.safetensors",
                                                            "*.safetensors.index.json"]))
    except Exception as e:  # noqa: BLE001 - offline, gated, missing: all say the same to the user
        raise CodecNotFoundError(f"codec.path={path!r} cannot be downloaded ({str(e).splitlines()[0][:200]}); "
                                 "download the checkpoint into a folder and set codec.path to it") from None


def _encoder_weights(folder: Path) -> dict[str, Any]:
    """The tensors under :data:`PREFIXES` of the checkpoint's safetensors files (nothing else is read)."""
    from safetensors import safe_open

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise CodecError(f"codec.path={str(folder)!r} holds no *.safetensors weights; save the checkpoint with "
                         "save_pretrained (transformers' layout)")
    found: dict[str, Any] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            for key in handle.keys():  # noqa: SIM118 - safe_open has no __iter__
                if key.startswith(tuple(PREFIXES.values())):
                    found[key] = handle.get_tensor(key)
    return found


class VibeVoiceLatentCodec:
    """The encoders of one VibeVoice checkpoint (see the module docstring). ``desc``: the description stored in a
    prepared index (then the weights load from its ``path`` on first use and must match its digest)."""

    name = NAME
    continuous = False  # stored arrays are features, not audio: the eval split keeps its reference recording
    stored_dtype = "float32"
    codebook_size = 0  # no vocabulary: families that learn codes refuse such data
    sample_rate = SAMPLE_RATE

    def __init__(self, path: str, desc: dict[str, Any] | None = None):
        self.path = path
        self.desc = desc
        self.parts: dict[str, Any] | None = None
        self.device = "cpu"

    @classmethod
    def load(cls, path: str) -> VibeVoiceLatentCodec:
        """For ``prepare``: the encoders of the checkpoint at ``path``, loaded now."""
        codec = cls(path)
        codec._load()
        return codec

    @classmethod
    def from_description(cls, desc: dict[str, Any]) -> VibeVoiceLatentCodec:
        """The codec of prepared data (its weights load only when it encodes or decodes)."""
        missing = [k for k in ("path", "hop_length", "acoustic_dim", "semantic_dim", "encoders_sha256")
                   if k not in desc]
        if missing:
            raise CodecError(f"codec description {json.dumps(desc)[:200]} lacks {missing}; prepare the data again")
        return cls(str(desc["path"]), dict(desc))

    def _load(self) -> dict[str, Any]:
        if self.parts is not None:
            return self.parts
        from transformers import AutoConfig, AutoModel

        folder = _folder(self.path)
        try:
            config = AutoConfig.from_pretrained(str(folder))
        except (OSError, ValueError, KeyError) as e:
            raise CodecError(f"codec.path={self.path!r}: its config.json cannot be read ({str(e)[:200]})") from None
        if getattr(config, "model_type", None) != "vibevoice":
            raise CodecError(f"codec.path={self.path!r} is a {getattr(config, 'model_type', '?')} model, not "
                             "VibeVoice; point it at the VibeVoice checkpoint you train (model.init_from)")
        acoustic, semantic = AutoModel.from_config(config.audio_config), AutoModel.from_config(
            config.semantic_model_config)
        weights = _encoder_weights(folder)
        for part, module in (("acoustic", acoustic), ("semantic", semantic)):
            own = {k[len(PREFIXES[part]):]: v for k, v in weights.items() if k.startswith(PREFIXES[part])}
            missing, _ = module.load_state_dict(own, strict=False)
            if missing:
                raise CodecError(f"codec.path={self.path!r} lacks weights of the {part} encoder ({missing[0]} ...); "
                                 "is it a whole VibeVoice checkpoint?")
            module.float().eval().requires_grad_(False)
        self.parts = {"acoustic": acoustic.to(self.device), "semantic": semantic.to(self.device),
                      "hop": int(np.prod(config.audio_config.downsampling_ratios)),
                      "digest": encoders_digest(acoustic.encoder, semantic)}
        if self.desc is not None and self.desc.get("encoders_sha256") != self.parts["digest"]:
            raise CodecError(f"codec.path={self.path!r} now holds other encoders than the ones the data was prepared "
                             "with (encoders_sha256 differs); restore that checkpoint or prepare the data again")
        return self.parts

    def to(self, device: str) -> VibeVoiceLatentCodec:
        self.device = str(device)
        if self.parts is not None:
            for part in ("acoustic", "semantic"):
                self.parts[part].to(self.device)
        return self

    @property
    def hop(self) -> int:
        return int(self.desc["hop_length"]) if self.desc else self._load()["hop"]

    @property
    def frame_rate(self) -> float:
        return self.sample_rate / self.hop

    @property
    def dims(self) -> tuple[int, int]:
        if self.desc:
            return int(self.desc["acoustic_dim"]), int(self.desc["semantic_dim"])
        parts = self._load()
        return int(parts["acoustic"].config.hidden_size), int(parts["semantic"].config.hidden_size)

    @property
    def num_codebooks(self) -> int:
        return sum(self.dims)

    def encode(self, wav: np.ndarray) -> np.ndarray:
        """float32 [N] in [-1, 1] at 24 kHz -> float32 [Da + Ds, T] (see the module docstring)."""
        import torch

        wav = mono_float32(wav, self.name)
        pcm = np.round(np.clip(wav, -1.0, 1.0) * PCM_SCALE)  # as codec.type=pcm stores it
        clip = pcm16_normalized(pcm)
        parts, hop = self._load(), self.hop
        padded = np.zeros(-(-clip.size // hop) * hop, dtype=np.float32)
        padded[: clip.size] = clip
        x = torch.from_numpy(padded)[None, None].to(self.device)
        with torch.no_grad():
            means = parts["acoustic"].encoder(x).latents[0]
            semantic = parts["semantic"](x).latents[0]
        return torch.cat([means, semantic], dim=-1).T.float().cpu().numpy()

    def decode(self, codes: np.ndarray) -> np.ndarray:
        """float [Da + Ds, T] -> float32 [T * hop] at 24 kHz: the σ-VAE's decoder on the stored means."""
        import torch

        parts = self._load()
        means = torch.from_numpy(np.asarray(codes, dtype=np.float32)[: self.dims[0]].T.copy())[None].to(self.device)
        with torch.no_grad():
            audio = parts["acoustic"].decode(means).audio
        return audio.reshape(-1).float().cpu().numpy()

    def describe(self) -> dict[str, Any]:
        if self.desc is not None:
            return dict(self.desc)
        acoustic, semantic = self.dims
        return describe_common(self, path=self.path, hop_length=self.hop, acoustic_dim=acoustic,
                               semantic_dim=semantic, dtype=self.stored_dtype,
                               encoders_sha256=self._load()["digest"])
