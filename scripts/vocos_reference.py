"""Reference outputs of upstream Vocos 0.1.0 (the vocoder of F5-TTS' mel) for voxrelay's re-implementation
(tests/unit/models/test_f5_dit.py).

Run it once in the environment of scripts/f5_reference.py (vocos comes with f5-tts; the same torchaudio .so files
moved away):

    /tmp/f5/bin/python scripts/vocos_reference.py [OUT_DIR]       # default: tests/fixtures/f5

Builds charactr/vocos-mel-24khz's architecture (its published config.yaml: 100 mel bins at 24 kHz, n_fft 1024, hop
256, ConvNeXt backbone, ISTFT head with center padding) at a tiny width, seeded, and writes
OUT_DIR/vocos_reference.safetensors (its state_dict under upstream's keys + "io.mel", "io.audio" = decode(mel)) and
vocos_config.yaml (the architecture, in the layout of the hub's config.yaml).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch
import yaml
from safetensors.torch import save_file
from vocos import Vocos

OUT = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "f5"
OUT.mkdir(parents=True, exist_ok=True)
torch.set_num_threads(1)
CONFIG = {
    "feature_extractor": {"class_path": "vocos.feature_extractors.MelSpectrogramFeatures",
                          "init_args": {"sample_rate": 24000, "n_fft": 1024, "hop_length": 256, "n_mels": 100,
                                        "padding": "center"}},
    "backbone": {"class_path": "vocos.models.VocosBackbone",
                 "init_args": {"input_channels": 100, "dim": 32, "intermediate_dim": 64, "num_layers": 2}},
    "head": {"class_path": "vocos.heads.ISTFTHead",
             "init_args": {"dim": 32, "n_fft": 1024, "hop_length": 256, "padding": "center"}},
}
(OUT / "vocos_config.yaml").write_text(yaml.safe_dump(CONFIG))
torch.manual_seed(0)
vocos = Vocos.from_hparams(str(OUT / "vocos_config.yaml")).eval()
t = torch.arange(12000) / 24000
wav = (0.3 * torch.sin(2 * math.pi * 220 * t) + 0.05 * torch.randn(12000, generator=torch.Generator().manual_seed(7)))
with torch.no_grad():
    mel = vocos.feature_extractor(wav[None])  # [1, 100, 47]
    audio = vocos.decode(mel)
state = {k: v.contiguous() for k, v in vocos.state_dict().items()}
save_file({**state, "io.mel": mel.contiguous(), "io.audio": audio.contiguous()},
          str(OUT / "vocos_reference.safetensors"))
print({k: list(v.shape) for k, v in state.items() if "convnext.1" not in k}, tuple(audio.shape))
