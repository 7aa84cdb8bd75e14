"""The Vocos vocoder (mel -> waveform) that F5-TTS speaks through, in plain torch under upstream's parameter names
(vocos 0.1.0 imports torchaudio, which has no CPU build for this torch): a ConvNeXt backbone over the log-mel and a
head that predicts the STFT's log-magnitude and phase, inverted by ``torch.istft``. Equal to upstream's ``decode`` on
the same weights (``tests/unit/models/test_f5_dit.py``, from ``scripts/vocos_reference.py``).

A folder as the hub's ``charactr/vocos-mel-24khz`` holds it loads with :meth:`Vocos.from_folder`: ``config.yaml``
(the backbone's and head's ``init_args``) and ``model.safetensors`` or ``pytorch_model.bin`` (read with
``torch.load(weights_only=True)``: tensors only, no code runs).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from voxrelay.errors import UserError


class VocoderError(UserError, ValueError):
    """A vocoder folder that cannot be read; the message names it and the fix."""


class ConvNeXtBlock(nn.Module):
    def __init__(self, dim: int, inner: int, scale: float) -> None:
        super().__init__()
        self.dwconv = nn.Conv1d(dim, dim, kernel_size=7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, inner)
        self.pwconv2 = nn.Linear(inner, dim)
        self.gamma = nn.Parameter(torch.full((dim,), scale))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, C, T]
        y = self.pwconv2(F.gelu(self.pwconv1(self.norm(self.dwconv(x).transpose(1, 2)))))
        return x + (self.gamma * y).transpose(1, 2)


class Backbone(nn.Module):
    def __init__(self, input_channels: int, dim: int, intermediate_dim: int, num_layers: int) -> None:
        super().__init__()
        self.embed = nn.Conv1d(input_channels, dim, kernel_size=7, padding=3)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.convnext = nn.ModuleList([ConvNeXtBlock(dim, intermediate_dim, 1 / num_layers) for _ in range(num_layers)])
        self.final_layer_norm = nn.LayerNorm(dim, eps=1e-6)

    def forward(self, mel: torch.Tensor) -> torch.Tensor:  # [B, n_mels, T] -> [B, T, dim]
        x = self.norm(self.embed(mel).transpose(1, 2)).transpose(1, 2)
        for block in self.convnext:
            x = block(x)
        return self.final_layer_norm(x.transpose(1, 2))


class ISTFTHead(nn.Module):
    def __init__(self, dim: int, n_fft: int, hop_length: int) -> None:
        super().__init__()
        self.n_fft, self.hop = n_fft, hop_length
        self.out = nn.Linear(dim, n_fft + 2)
        self.istft = nn.Module()
        self.istft.register_buffer("window", torch.hann_window(n_fft))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, T, dim] -> [B, hop * (T - 1)]
        mag, phase = self.out(x).transpose(1, 2).chunk(2, dim=1)
        spec = torch.clip(torch.exp(mag), max=1e2) * (torch.cos(phase) + 1j * torch.sin(phase))
        return torch.istft(spec, self.n_fft, self.hop, self.n_fft, self.istft.window, center=True)


class Vocos(nn.Module):
    """``decode``: log-mel [B, n_mels, T] -> waveform [B, hop x (T - 1)]."""

    def __init__(self, input_channels: int = 100, dim: int = 512, intermediate_dim: int = 1536, num_layers: int = 8,
                 n_fft: int = 1024, hop_length: int = 256) -> None:
        super().__init__()
        self.backbone = Backbone(input_channels, dim, intermediate_dim, num_layers)
        self.head = ISTFTHead(dim, n_fft, hop_length)

    @torch.no_grad()
    def decode(self, mel: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(mel))

    @classmethod
    def load(cls, spec: str) -> Vocos:
        """``model.vocoder``: a local folder, or a hub id (``charactr/vocos-mel-24khz``) fetched into the hub cache."""
        from voxrelay.models.hf import looks_local

        if Path(spec).expanduser().is_dir() or looks_local(spec):
            return cls.from_folder(Path(spec).expanduser())
        from huggingface_hub import snapshot_download

        try:
            folder = snapshot_download(spec, allow_patterns=["config.yaml", "*.safetensors", "pytorch_model.bin"])
        except Exception as e:  # the hub client's errors have no common base worth naming
            raise VocoderError(f"model.vocoder={spec!r} is not a local folder and cannot be fetched from the hub "
                               f"({str(e).splitlines()[0][:200]}); download it (huggingface-cli download {spec} "
                               "--local-dir vocos) and set model.vocoder to that folder") from None
        return cls.from_folder(folder)

    @classmethod
    def from_folder(cls, folder: str | Path) -> Vocos:
        """A folder laid out as the hub's ``charactr/vocos-mel-24khz`` (``config.yaml`` + weights)."""
        import yaml

        folder = Path(folder)
        fix = "point it at a folder holding Vocos' config.yaml and model.safetensors (or pytorch_model.bin)"
        try:
            config = yaml.safe_load((folder / "config.yaml").read_text())
            backbone, head = config["backbone"]["init_args"], config["head"]["init_args"]
        except (OSError, KeyError, TypeError, yaml.YAMLError) as e:
            raise VocoderError(f"vocoder {str(folder)!r}: no readable config.yaml with backbone and head ({e}); "
                               f"{fix}") from None
        if head.get("padding", "same") != "center":
            raise VocoderError(f"vocoder {str(folder)!r}: its head pads {head.get('padding', 'same')!r}; only "
                               "'center' (the mel Vocos F5-TTS uses) is supported")
        vocos = cls(backbone["input_channels"], backbone["dim"], backbone["intermediate_dim"], backbone["num_layers"],
                    head["n_fft"], head["hop_length"])
        state = _weights(folder, fix)
        state = {k: v for k, v in state.items() if not k.startswith("feature_extractor.")}  # the mel is ours
        try:
            vocos.load_state_dict(state)
        except RuntimeError as e:
            raise VocoderError(f"vocoder {str(folder)!r}: its weights do not fit its config.yaml ({e})") from None
        return vocos.eval()


def _weights(folder: Path, fix: str) -> dict[str, torch.Tensor]:
    if (folder / "model.safetensors").is_file():
        from safetensors.torch import load_file

        return load_file(str(folder / "model.safetensors"))
    if (folder / "pytorch_model.bin").is_file():
        return torch.load(folder / "pytorch_model.bin", map_location="cpu", weights_only=True)
    raise VocoderError(f"vocoder {str(folder)!r} holds no model.safetensors or pytorch_model.bin; {fix}")
