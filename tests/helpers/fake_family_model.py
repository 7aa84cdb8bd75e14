"""The built model of the test-only ``fake`` family (:mod:`tests.helpers.fake_family`): everything the seam asks
of a family, in plain torch. Its sequence: ``[text bytes, SEP, AUDIO + k * C + code for each frame and codebook k,
EOS]``, the loss on what follows SEP."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from voxrelay.models.base import (
    DataSpec,
    Example,
    LoraDefaults,
    LossTerm,
    Request,
    Row,
    decay_groups,
    num_frames,
    speak_codes,
    with_counts,
)
from voxrelay.models.seam import FamilyModelBase
from voxrelay.plan.formulas import Shape

SEP, EOS, PAD, AUDIO = 256, 257, 258, 259
META = "voxrelay.json"
WEIGHTS = "model.safetensors"


class FakeNet(nn.Module):
    def __init__(self, vocab: int, width: int, dropout: float):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.drop = nn.Dropout(dropout)
        self.rnn = nn.GRU(width, width, batch_first=True)
        self.proj = nn.Linear(width, width)
        self.head = nn.Linear(width, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.rnn(self.drop(self.embed(ids)))
        return self.head(torch.tanh(self.proj(hidden)))


class FakeModel(FamilyModelBase):
    family = "fake"
    request_fields: tuple[str, ...] = ()
    max_length_key = "model.max_length"

    def __init__(self, module: FakeNet, settings: dict[str, Any]):
        self.module, self.settings = module, settings
        self.k, self.c = settings["num_codebooks"], settings["codebook_size"]
        self.speakers = list(settings["speakers"])
        self.max_length = settings["max_length"]

    def _prompt(self, text: str) -> list[int]:
        return list(text.encode()) + [SEP]

    def length(self, row: Row) -> int:
        return len(row.text.encode()) + 2 + self.k * num_frames(row)

    def example(self, row: Row) -> Example:
        codes = np.asarray(row.codes, dtype=np.int64)
        audio = (AUDIO + np.arange(self.k)[:, None] * self.c + codes).T.reshape(-1)  # frame by frame
        prompt = self._prompt(row.text)
        ids = np.concatenate([prompt, audio, [EOS]]).astype(np.int64)
        labels = np.full_like(ids, -100)
        labels[len(prompt) - 1:-1] = ids[len(prompt):]  # position t predicts t + 1, from SEP on
        return {"ids": ids, "labels": labels}

    def collate(self, examples: list[Example]) -> dict[str, torch.Tensor]:
        width = max(len(e["ids"]) for e in examples)
        ids = torch.full((len(examples), width), PAD, dtype=torch.int64)
        labels = torch.full((len(examples), width), -100, dtype=torch.int64)
        for i, e in enumerate(examples):
            ids[i, :len(e["ids"])] = torch.from_numpy(e["ids"])
            labels[i, :len(e["labels"])] = torch.from_numpy(e["labels"])
        return with_counts({"ids": ids, "labels": labels}, {"ce": (labels != -100).sum()})

    def loss(self, module: nn.Module, batch: dict[str, torch.Tensor]) -> dict[str, LossTerm]:
        logits = module(batch["ids"]).float()
        labels = batch["labels"]
        total = nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100,
                                            reduction="sum")
        return {"ce": LossTerm(total, (labels != -100).sum())}

    def speak(self, request: Request, codec: Any, max_frames: int | None = None, temperature: float = 0.8,
              top_k: int | None = 50, seed: int = 0):
        return speak_codes(self, request, codec, max_frames, temperature, top_k, seed)

    @torch.no_grad()
    def generate(self, text: str, speaker: str | None = None, max_frames: int | None = None,
                 temperature: float = 0.8, top_k: int | None = 50, seed: int = 0) -> np.ndarray:
        """Codes [K, T], each step restricted to the codebook due next (EOS only at a frame boundary)."""
        gen = torch.Generator().manual_seed(seed)
        ids = self._prompt(text)
        room = (self.max_length - len(ids) - 1) // self.k
        frames = room if max_frames is None else min(room, max_frames)
        codes: list[int] = []
        was = self.module.training
        self.module.eval()
        try:
            while len(codes) < frames * self.k:
                k = len(codes) % self.k
                logits = self.module(torch.tensor([ids]))[0, -1].float()
                allowed = torch.full_like(logits, float("-inf"))
                allowed[AUDIO + k * self.c:AUDIO + (k + 1) * self.c] = 0
                if k == 0 and codes:
                    allowed[EOS] = 0
                logits = logits + allowed
                if temperature <= 0:
                    token = int(logits.argmax())
                else:
                    token = int(torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=gen))
                if token == EOS:
                    break
                ids.append(token)
                codes.append(token - AUDIO - k * self.c)
        finally:
            self.module.train(was)
        return np.asarray(codes, dtype=np.int64).reshape(-1, self.k).T

    def param_groups(self, weight_decay: float) -> list[dict[str, Any]]:
        return decay_groups(self.module, weight_decay)

    def lora_defaults(self) -> LoraDefaults:
        return LoraDefaults(r=4, alpha=8, dropout=0.0, rslora=False, target_modules=["proj"], modules_to_save=["head"])

    def plan_shape(self, lora_rank: int = 0) -> Shape:
        width = self.settings["width"]
        return Shape(width, width, 1, width, width, 1, self.module.head.out_features, lora_rank)

    def save_pretrained(self, folder: str | os.PathLike[str]) -> None:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in self.module.state_dict().items()}, str(folder / WEIGHTS))
        # "family": the spec load_model reads; "speakers": what `voxrelay voices EXPORT` lists
        (folder / META).write_text(json.dumps({"family": "fake", "speakers": self.speakers, "settings": self.settings}))


def _module(settings: dict[str, Any]) -> FakeNet:
    vocab = AUDIO + settings["num_codebooks"] * settings["codebook_size"]
    return FakeNet(vocab, settings["width"], settings["dropout"])


def build(cfg: Any, data: DataSpec, seed: int, meta: bool = False) -> FakeModel:
    settings = {"num_codebooks": data.num_codebooks, "codebook_size": data.codebook_size,
                "speakers": list(data.speakers), "width": cfg.width, "dropout": cfg.dropout,
                "max_length": cfg.max_length}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if meta:
            with torch.device("meta"):
                return FakeModel(_module(settings), settings)
        return FakeModel(_module(settings), settings)


def load(folder: str | os.PathLike[str]) -> FakeModel:
    settings = json.loads((Path(folder) / META).read_text())["settings"]
    model = FakeModel(_module(settings), settings)
    model.module.load_state_dict(load_file(str(Path(folder) / WEIGHTS)))
    return model
