"""The ``f5`` family model: examples (a clip's log-mel and its text's ids), the flow-matching loss (:mod:`.flow`) with
draws from a family generator, upstream's EMA (:mod:`.ema`), synthesis by infilling after a voice prompt of the
training data, decoded by Vocos (:mod:`.vocos`).

A saved folder holds ``model.safetensors`` in the layout of f5-tts' released checkpoints (``ema_model.transformer.*``:
upstream's ``load_checkpoint(..., use_ema=True)`` reads it), ``vocab.txt`` when the text has one, ``voxrelay.json``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from voxrelay.codecs.pcm import samples
from voxrelay.models.base import (
    Example,
    LoraDefaults,
    LossTerm,
    LossTerms,
    Request,
    RequestError,
    Row,
    Speech,
    check_request,
    decay_groups,
    module_classes,
    num_frames,
    with_counts,
)
from voxrelay.models.f5 import flow
from voxrelay.models.f5.config import HOP, SAMPLE_RATE
from voxrelay.models.f5.dit import DiT
from voxrelay.models.f5.ema import WeightsEma
from voxrelay.models.f5.text import Vocab, batch_ids
from voxrelay.models.hf import write_meta
from voxrelay.models.seam import FamilyModelBase

FORMAT_VERSION = 1
EMA_PREFIX = "ema_model."  # f5-tts' released checkpoints: its EMA model's state_dict
EVAL_SEED = 2**31 - 1  # not a train.seed anyone picks: eval draws apart from a run's first training draws
VOICES = "voices.safetensors"  # an export's voice prompts: each speaker's clip (int16 at 24 kHz) ...
VOICE_TEXTS = "voices.json"  # ... and its transcript
SETTINGS = ("steps", "cfg_strength", "sway", "vocoder", "max_seconds", "full_budget_seconds")


class F5Trainer(nn.Module):
    """``transformer``: the :class:`~voxrelay.models.f5.dit.DiT` (so the state_dict is upstream ``CFM``'s); the
    loss' draws come from ``generator`` (CPU)."""

    def __init__(self, transformer: DiT, generator: torch.Generator) -> None:
        super().__init__()
        self.transformer = transformer
        self.generator = generator

    def forward(self, mel: torch.Tensor, text: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
        """The summed squared error of the flow over the infilled spans (float32). In eval mode the draws are the
        same for every batch of a shape (a fixed seed): held-out losses compare across evaluations, and a batch read
        with other texts (``eval/text_gain``) gets the same spans, noise and times as with its own."""
        generator = self.generator if self.training else torch.Generator().manual_seed(EVAL_SEED)
        draws = flow.draw(generator, mel.shape[0], mel.shape[1], mel.shape[2])
        return flow.loss_terms(self.transformer, mel, text, lens, draws)[0]


def frames(count: int) -> int:
    """Mel frames of a clip of ``count`` samples (centered STFT)."""
    return count // HOP + 1


class F5(FamilyModelBase):
    """A :class:`~voxrelay.models.base.FamilyModel` of the ``f5`` family."""

    family = "f5"
    request_fields: tuple[str, ...] = ()
    uses_corpus = True  # voice prompts: a clip of the speaker from the training data, with its transcript
    max_length_key = "model.max_seconds (in mel frames, 93.75 a second)"
    frame_rate = SAMPLE_RATE / HOP  # Speech.frames: mel frames
    packing_refusal = ("the DiT attends over a clip's whole mel without a mask between examples, and each example "
                       "gets its own infilled span; batches stay padded, bucketed by length")

    def __init__(self, module: F5Trainer, vocab: Vocab, settings: dict[str, Any], ema: bool) -> None:
        self.module = module
        self.vocab = vocab
        self.settings = settings
        self.speakers: list[str] = []
        self.max_length = frames(int(settings["max_seconds"] * SAMPLE_RATE))
        self.full_budget_length = frames(int(settings.get("full_budget_seconds", 15.0) * SAMPLE_RATE))
        self.averaged = WeightsEma(module, ema)
        self.prompts: dict[str | None, Any] = {}

    @property
    def dit(self) -> DiT:
        return self.module.transformer

    # ---------------------------------------------------------------- training

    def use_corpus(self, rows: list) -> None:
        """Voice prompts: per speaker (and for any voice, None) the training row with the shortest clip."""
        by_speaker: dict[str | None, Any] = {}
        for row in sorted(rows, key=lambda r: (num_frames(r), r.id)):
            by_speaker.setdefault(row.speaker, row)
            by_speaker.setdefault(None, row)
        self.prompts = by_speaker
        self.speakers = sorted(s for s in by_speaker if s is not None)

    def length(self, row: Row) -> int:
        return frames(num_frames(row))

    def example(self, row: Row) -> Example:
        wav = torch.from_numpy(samples(row.codes))[None]
        return {"mel": flow.log_mel(wav)[0].T.numpy(), "text": np.asarray(self.vocab.encode(row.text), np.int64)}

    def collate(self, examples: list[Example]) -> dict[str, torch.Tensor]:
        """Mel [B, N, 100] zero-padded, text [B, Nt] -1-padded, lens [B]; the count of ``flow``: the batch's real
        (frame, channel) elements (the infilled span, 70-100% of them, is drawn in the step; see docs/f5.md)."""
        lens = torch.tensor([len(e["mel"]) for e in examples])
        mel = torch.zeros((len(examples), int(lens.max()), flow.N_MELS))
        for i, e in enumerate(examples):
            mel[i, : len(e["mel"])] = torch.from_numpy(e["mel"])
        batch = {"mel": mel, "text": batch_ids([e["text"].tolist() for e in examples]), "lens": lens}
        return with_counts(batch, {"flow": lens.sum() * flow.N_MELS})

    def loss(self, module: torch.nn.Module, batch: dict[str, torch.Tensor]) -> LossTerms:
        total = module(mel=batch["mel"], text=batch["text"], lens=batch["lens"])
        return {"flow": LossTerm(total, batch["lens"].sum() * flow.N_MELS)}

    def generators(self) -> dict[str, torch.Generator]:
        return {"flow": self.module.generator}

    def after_optimizer_step(self) -> None:
        self.averaged.update()

    def extra_state(self) -> dict[str, torch.Tensor]:
        return self.averaged.state()

    def load_extra_state(self, state: dict[str, torch.Tensor]) -> None:
        self.averaged.load(state)

    def eval_weights(self):
        return self.averaged.swapped_in()

    def param_groups(self, weight_decay: float) -> list[dict[str, Any]]:
        return decay_groups(self.module, weight_decay)

    def lora_defaults(self) -> LoraDefaults:
        """Adapters on every block's attention and MLP projections (F5's users fine-tune in full; this is LoRA's
        usual choice for a DiT)."""
        targets = r".*transformer_blocks\.\d+\.(attn\.(to_q|to_k|to_v|to_out\.0)|ff\.ff\.(0\.0|2))"
        return LoraDefaults(r=16, alpha=32, dropout=0.0, rslora=False, target_modules=targets, modules_to_save=[])

    def fsdp_layer_classes(self) -> tuple[type[torch.nn.Module], ...]:
        return module_classes(self.module, ("DiTBlock",))

    def plan_shape(self, lora_rank: int = 0):
        """The DiT as ``voxrelay plan``'s Llama-style layer and what it saves beyond it (:mod:`.plan`)."""
        from voxrelay.models.f5.plan import plan_shape

        return plan_shape(self.dit.sizes, self.module, lora_rank)

    # ---------------------------------------------------------------- synthesis

    def speak(self, request: Request, codec: Any, max_frames: int | None = None, temperature: float = 0.8,
              top_k: int | None = 50, seed: int = 0) -> Speech:
        """Speech for ``request.text`` in the voice of ``request.speaker`` (a speaker of the training data; None:
        any): the frames after that speaker's shortest training clip, whose transcript comes first, filled by the
        ODE (``model.steps``, ``cfg_strength``, ``sway``; seeded by ``seed``; ``temperature``/``top_k`` do not
        apply), as long as upstream estimates (the prompt's frames per byte of text), at most ``max_frames``."""
        from voxrelay.models.f5.synthesis import speak

        check_request(self, request)
        if request.speaker not in self.prompts:
            known = ", ".join(repr(s) for s in self.speakers[:10]) or "none: the run has no training rows"
            raise RequestError(f"no voice prompt for {request.speaker!r}; the training data's voices: {known}")
        with self.eval_weights():
            return speak(self, self.prompts[request.speaker], request.text, max_frames, seed)

    # ---------------------------------------------------------------- files

    def _save_voices(self, folder: Path) -> None:
        """The voice prompts synthesis uses (each speaker's and the default clip with its transcript): an export
        speaks as the run did."""
        import json

        from safetensors.torch import save_file

        names = {"" if speaker is None else speaker: row for speaker, row in self.prompts.items()}
        if not names:
            return
        save_file({name or "_": torch.from_numpy(np.asarray(row.codes, dtype=np.int16).reshape(1, -1).copy())
                   for name, row in names.items()}, str(folder / VOICES))
        (folder / VOICE_TEXTS).write_text(json.dumps({name or "_": row.text for name, row in names.items()},
                                                     ensure_ascii=False, indent=1))

    def load_voices(self, folder: Path) -> None:
        """The voice prompts an export holds (none: the model speaks only in a run, from its training rows)."""
        import json
        from types import SimpleNamespace

        from safetensors.torch import load_file

        if not (folder / VOICES).is_file():
            return
        clips, texts = load_file(str(folder / VOICES)), json.loads((folder / VOICE_TEXTS).read_text())
        self.prompts = {None if name == "_" else name: SimpleNamespace(codes=clips[name].numpy(), text=texts[name],
                                                                     speaker=None if name == "_" else name)
                        for name in clips}
        self.speakers = sorted(s for s in self.prompts if s is not None)

    def save_pretrained(self, folder: str | os.PathLike[str]) -> None:
        """``model.safetensors`` as f5-tts releases checkpoints (the EMA weights under ``ema_model.``), the vocab,
        ``voxrelay.json`` last."""
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        with self.eval_weights():
            state = {EMA_PREFIX + k: v.detach().cpu().clone() for k, v in self.module.state_dict().items()}
        save_file(state, str(folder / "model.safetensors"))
        self._save_voices(folder)
        if self.vocab.ids is not None:
            (folder / "vocab.txt").write_text("".join(f"{t}\n" for t in self.vocab.ids), encoding="utf-8")
        sizes = self.dit.sizes
        write_meta(folder, {"format_version": FORMAT_VERSION, "family": self.family, "settings": self.settings,
                            "sizes": {k: getattr(sizes, k) for k in sizes.__dataclass_fields__}})
