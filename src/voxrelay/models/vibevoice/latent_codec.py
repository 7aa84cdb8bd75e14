"""``codec.type: vibevoice_latents`` (the family's own codec, ``FamilySpec.codecs``): VibeVoice's frozen encoders'
outputs, computed once by ``prepare`` instead of at every training session (``codec.type: pcm`` stores the audio
and the family encodes it at train time).

A row's stored array is float32 ``[Da + Ds, T]``: per latent (one per ``hop_length`` samples at 24 kHz, 7.5 per
second), the σ-VAE's means (``Da`` values, before its sampling noise and the model's scaling) then the semantic
encoder's features (``Ds``). Each clip is encoded alone exactly as training encodes it from stored audio (16-bit
PCM, normalised to -25 dBFS, zero-padded to whole latents: :data:`EXTRACTION`), in float32 (TF32 off on a GPU).

``codec.path`` names the VibeVoice checkpoint (transformers' layout: a folder or hub id, or a voxrelay export)
whose encoders make the latents; only those weights are read (``model.audio_tower.*``,
``model.semantic_tokenizer_encoder.*``; from the hub only the files that hold them). The data records a sketch of
them (:func:`encoders_sketch`): training refuses data made by other encoders (:func:`mismatch`). ``decode`` turns
stored means back into audio with the σ-VAE's decoder. Rebuilt from a prepared ``index.json``, the codec loads its
weights only when it encodes or decodes (training reads the stored features and never does).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from voxrelay.codecs.base import CodecError, CodecNotFoundError, describe_common, looks_local, mono_float32

NAME = "vibevoice_latents"
SAMPLE_RATE = 24000
PCM_SCALE = 32767.0
TARGET_DBFS = -25.0
EXTRACTION = "pcm16, rms -25 dBFS then peak <= 1, zero-padded to whole latents, float32, each clip alone"
PREFIXES = {"acoustic": "model.audio_tower.", "semantic": "model.semantic_tokenizer_encoder."}
FIX = ("point codec.path at the VibeVoice checkpoint you train (model.init_from), in transformers' layout (a `-hf` "
       "repository, or a folder written by save_pretrained)")
SKETCH_VALUES, SKETCH_DIM = 4096, 8  # values drawn per tensor, random projections of them
SKETCH_TOLERANCE = 0.02  # x the sampled values' norm: rounding to bf16 moves a projection by < 0.004 of it


def normalize(wav: np.ndarray, target_dbfs: float = TARGET_DBFS, eps: float = 1e-6) -> np.ndarray:
    """RMS to ``target_dbfs``, then peaks above 1 scaled down (VibeVoiceAcousticTokenizerFeatureExtractor's)."""
    wav = np.asarray(wav, dtype=np.float32).reshape(-1)
    wav = wav * (10 ** (target_dbfs / 20) / (float(np.sqrt(np.mean(wav ** 2))) + eps))
    peak = float(np.abs(wav).max()) if wav.size else 0.0
    return (wav / (peak + eps) if peak > 1.0 else wav).astype(np.float32)


def pcm16_normalized(samples: np.ndarray) -> np.ndarray:
    """Samples stored as 16-bit PCM (int [N] or [1, N]) as VibeVoice's feature extractor gives them."""
    return normalize(np.asarray(samples, dtype=np.float32).reshape(-1) / PCM_SCALE)


def encoders_sketch(acoustic_encoder: Any, semantic_encoder: Any) -> list[float]:
    """What stands for the two encoders' weights: :data:`SKETCH_DIM` random projections of values drawn from every
    tensor (the same positions and projections for the same architecture), then those values' norm. Encoders
    loaded in another dtype (bf16, fp16) give nearly the same numbers (:func:`same_encoders`); other weights do
    not."""
    import torch

    generator = torch.Generator().manual_seed(0)
    total, square = torch.zeros(SKETCH_DIM, dtype=torch.float64), 0.0
    for module in (acoustic_encoder, semantic_encoder):
        for _, tensor in sorted(module.state_dict().items()):
            flat = tensor.detach().reshape(-1)
            if not flat.is_floating_point() or flat.numel() == 0:
                continue
            where = torch.randint(0, flat.numel(), (min(SKETCH_VALUES, flat.numel()),), generator=generator)
            values = flat[where.to(flat.device)].to("cpu", torch.float64)
            total += values @ torch.randn(values.numel(), SKETCH_DIM, generator=generator, dtype=torch.float64)
            square += float(values.square().sum())
    return [float(x) for x in total] + [math.sqrt(square)]


def same_encoders(a: list[float], b: list[float]) -> bool:
    """Whether two :func:`encoders_sketch` es are of the same weights (up to a dtype's rounding)."""
    if len(a) != len(b) or not a:
        return False
    norm = max(abs(a[-1]), abs(b[-1]), 1e-12)
    return abs(a[-1] - b[-1]) <= SKETCH_TOLERANCE * norm and \
        all(abs(x - y) <= SKETCH_TOLERANCE * norm for x, y in zip(a[:-1], b[:-1], strict=True))


def mismatch(desc: dict[str, Any], acoustic_encoder: Any, semantic_encoder: Any, hop: int) -> str | None:
    """Why latents described by ``desc`` (a prepared index's codec) cannot feed a model with these encoders and
    ``hop`` samples per latent; None when they can."""
    dims = (int(acoustic_encoder.config.hidden_size), int(semantic_encoder.config.hidden_size))
    if (desc.get("acoustic_dim"), desc.get("semantic_dim"), desc.get("hop_length")) != (*dims, hop):
        return (f"its latents are {desc.get('acoustic_dim')} + {desc.get('semantic_dim')} values per "
                f"{desc.get('hop_length')} samples, the model's {dims[0]} + {dims[1]} per {hop}")
    if desc.get("extraction") != EXTRACTION:
        return f"they were extracted as {desc.get('extraction')!r}, this voxrelay extracts {EXTRACTION!r}"
    if not same_encoders(list(desc.get("encoders_sketch") or []), encoders_sketch(acoustic_encoder,
                                                                                  semantic_encoder)):
        return "the model's encoders have other weights"
    return None


def _hub_folder(repo: str) -> Path:
    """The snapshot of hub repository ``repo`` with its config and only the weight files that hold the encoders."""
    from huggingface_hub import hf_hub_download, snapshot_download

    folder = Path(snapshot_download(repo, allow_patterns=["config.json", "*.safetensors.index.json"]))
    index = next(folder.glob("*.safetensors.index.json"), None)
    files = ["model.safetensors"] if index is None else sorted(
        {f for k, f in json.loads(index.read_text())["weight_map"].items() if k.startswith(tuple(PREFIXES.values()))})
    for name in files:
        hf_hub_download(repo, name)
    return folder


def _folder(path: str) -> Path:
    folder = Path(path).expanduser()
    if folder.is_dir():
        return folder
    if looks_local(path):
        raise CodecNotFoundError(f"codec.path={path!r}: no such folder (and not a hub id); {FIX}")
    try:
        return _hub_folder(path)
    except Exception as e:  # noqa: BLE001 - offline, gated, missing: all say the same to the user
        first = (str(e).splitlines() or [type(e).__name__])[0]
        raise CodecNotFoundError(f"codec.path={path!r} cannot be downloaded ({first}); download the checkpoint into a "
                                 "folder (or run once with network access) and set codec.path to it") from None


def _encoder_weights(folder: Path) -> dict[str, Any]:
    """The tensors under :data:`PREFIXES` of the checkpoint's safetensors files (nothing else is read)."""
    from safetensors import safe_open

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise CodecError(f"codec.path={str(folder)!r} holds no *.safetensors weights; {FIX}")
    found: dict[str, Any] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            for key in handle.keys():  # noqa: SIM118 - safe_open has no __iter__
                if key.startswith(tuple(PREFIXES.values())):
                    found[key] = handle.get_tensor(key)
    return found


class VibeVoiceLatentCodec:
    """The encoders of one VibeVoice checkpoint (see the module docstring). ``desc``: the description stored in a
    prepared index (then the weights load from its ``path`` on first use and must match its sketch)."""

    name = NAME
    path_hint = "the VibeVoice checkpoint whose encoders make the latents: the one you train (model.init_from)"
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
        missing = [k for k in ("path", "hop_length", "acoustic_dim", "semantic_dim", "encoders_sketch")
                   if k not in desc]
        if missing:
            raise CodecError(f"the prepared data's codec description (index.json) lacks {', '.join(missing)}: it was "
                             "prepared by an earlier voxrelay; prepare it again (`voxrelay prepare CONFIG "
                             "--overwrite`, or under another data.name)")
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
                             f"VibeVoice; {FIX}")
        acoustic, semantic = AutoModel.from_config(config.audio_config), AutoModel.from_config(
            config.semantic_model_config)
        weights = _encoder_weights(folder)
        for part, module in (("acoustic", acoustic), ("semantic", semantic)):
            own = {k[len(PREFIXES[part]):]: v for k, v in weights.items() if k.startswith(PREFIXES[part])}
            missing, _ = module.load_state_dict(own, strict=False)
            if missing:
                raise CodecError(f"codec.path={self.path!r} lacks weights of the {part} encoder ({missing[0]} ...); "
                                 f"{FIX}")
            module.float().eval().requires_grad_(False)
        acoustic.encoder.to(self.device)  # the decoder stays on the CPU: prepare never uses it
        self.parts = {"acoustic": acoustic, "semantic": semantic.to(self.device),
                      "hop": int(np.prod(config.audio_config.downsampling_ratios)),
                      "sketch": encoders_sketch(acoustic.encoder, semantic)}  # once: describe() is asked often
        if self.desc is not None:
            why = mismatch(self.desc, acoustic.encoder, semantic, self.parts["hop"])
            if why:
                raise CodecError(f"codec.path={self.path!r} no longer holds the encoders the data was prepared with "
                                 f"({why}); restore that checkpoint, or prepare the data again")
        return self.parts

    def to(self, device: str) -> VibeVoiceLatentCodec:
        """Where the encoders run (``prepare`` on a GPU when there is one)."""
        self.device = str(device)
        if self.parts is not None:
            self.parts["acoustic"].encoder.to(self.device)
            self.parts["semantic"].to(self.device)
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
        with torch.no_grad(), torch.backends.cudnn.flags(enabled=True, allow_tf32=False):  # float32 convolutions
            means = parts["acoustic"].encoder(x).latents[0]
            semantic = parts["semantic"](x).latents[0]
        return torch.cat([means, semantic], dim=-1).T.float().cpu().numpy()

    def decode(self, codes: np.ndarray) -> np.ndarray:
        """float [Da + Ds, T] -> float32 [T * hop] at 24 kHz: the σ-VAE's decoder on the stored means."""
        import torch

        parts = self._load()
        means = torch.from_numpy(np.asarray(codes, dtype=np.float32)[: self.dims[0]].T.copy())[None]
        with torch.no_grad():
            audio = parts["acoustic"].decode(means).audio  # on the CPU, where the decoder stays
        return audio.reshape(-1).float().cpu().numpy()

    def describe(self) -> dict[str, Any]:
        if self.desc is not None:
            return dict(self.desc)
        acoustic, semantic = self.dims
        return describe_common(self, path=self.path, hop_length=self.hop, acoustic_dim=acoustic,
                               semantic_dim=semantic, dtype=self.stored_dtype, extraction=EXTRACTION,
                               encoders_sketch=self._load()["sketch"])
