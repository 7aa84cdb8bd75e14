"""The ``vibevoice`` family model: examples (:mod:`.examples`), the training forward (:mod:`.modeling`), the
EMA of the diffusion head (:mod:`.ema`), synthesis through transformers' generation (:mod:`.generation`).

A saved folder is transformers' layout (``VibeVoiceForConditionalGeneration.from_pretrained`` loads it: the
EMA weights of the diffusion head, the tokenizer, a generation config naming DPM-Solver++) + ``voxrelay.json``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from voxrelay.models.base import (
    Example,
    LoraDefaults,
    LossTerm,
    LossTerms,
    Request,
    Row,
    Speech,
    check_request,
    decay_groups,
    module_classes,
)
from voxrelay.models.hf import read_meta, write_meta
from voxrelay.models.lora import save_adapter
from voxrelay.models.seam import decoder_shape
from voxrelay.models.vibevoice import examples as ex
from voxrelay.models.vibevoice.config import SAMPLE_RATE
from voxrelay.models.vibevoice.ema import DiffusionEma
from voxrelay.models.vibevoice.generation import speak, voice_prompts, waveform
from voxrelay.models.vibevoice.script import parse_script, spoken

FORMAT_VERSION = 1
LORA_TARGETS = r".*language_model\.layers\.\d+\.(self_attn\.(q|k|v|o)_proj|mlp\.(gate|up|down)_proj)"
CONNECTORS = ["multi_modal_projector", "semantic_connector"]


class VibeVoice(DiffusionEma):
    """A :class:`~voxrelay.models.base.FamilyModel` of the ``vibevoice`` family. ``module``: a
    :class:`~voxrelay.models.vibevoice.modeling.VibeVoiceTrainer` (its ``net`` the transformers model);
    ``maker``: the example maker (tokenizer, special ids, voice prompts); ``settings``: the family's config
    keys that act after building (loss weights, synthesis steps, LoRA extras)."""

    family = "vibevoice"
    packing_refusal = ("a batch's speech latents go through the diffusion head clip by clip (and, from stored "
                       "audio, through the encoders), and voice prompts are drawn per example; batches stay padded, "
                       "bucketed by length")
    chunked_heads = True  # its CE goes through head_loss (train.chunked_loss)
    max_length_key = "model.max_length"
    request_fields: tuple[str, ...] = ("voice_prompts",)
    uses_corpus = True  # voice prompts of the training data's voices (a row's, or a request's speaker column)
    speakers: list[str] = []  # voices come as prompts (or a row's speaker column), not as trained names
    upstream_prefix = "net."  # transformers' model inside module: adapter-only exports are laid out for it

    def __init__(self, module: Any, maker: ex.ExampleMaker, max_length: int, settings: dict[str, Any]) -> None:
        super().__init__(settings.get("ema_decay"))
        self.module = module
        self.maker = maker
        self.max_length = max_length
        self.settings = settings

    @property
    def net(self) -> Any:
        return self.module.net

    @property
    def frame_rate(self) -> float:
        """Latents per second (what :meth:`speak` counts as frames)."""
        return SAMPLE_RATE / self.maker.hop

    # ---------------------------------------------------------------- training

    def use_corpus(self, rows: list) -> None:
        """Rows that voice prompts come from (the training split)."""
        self.maker.use_corpus(rows)

    def length(self, row: Row) -> int:
        return self.maker.length(row)

    def example(self, row: Row) -> Example:
        return self.maker.make(row)

    def collate(self, examples: list[Example]) -> dict[str, torch.Tensor]:
        return ex.collate(examples, self.maker.ids["eos"], self.maker.hop, self.settings["ddpm_batch_multiplier"])

    def loss(self, module: torch.nn.Module, batch: dict[str, torch.Tensor]) -> LossTerms:
        out = module(**batch, loss_kernel=self.loss_kernel, loss_chunk_tokens=self.loss_chunk_tokens)
        return {"ce": LossTerm(out["ce_sum"], out["ce_count"], self.settings["ce_loss_weight"]),
                "diffusion": LossTerm(out["diffusion_sum"], out["diffusion_count"],
                                      self.settings["diffusion_loss_weight"])}

    def generators(self) -> dict[str, torch.Generator]:
        return {"diffusion": self.module.generator}

    def param_groups(self, weight_decay: float) -> list[dict[str, Any]]:
        return decay_groups(self.module, weight_decay)

    def lora_defaults(self) -> LoraDefaults:
        """The community trainer's: r=8, alpha=32, dropout 0.05 on the LM's attention and MLP projections only
        (a path-anchored regex: the diffusion head has gate/up/down_proj too); the diffusion head (and the
        connectors, when asked) trained in full beside them."""
        full = (["diffusion_head"] if self.settings["train_diffusion_head"] else []) + \
            (CONNECTORS if self.settings["train_connectors"] else [])
        return LoraDefaults(r=8, alpha=32, dropout=0.05, rslora=False, target_modules=LORA_TARGETS,
                            modules_to_save=full)

    def plan_shape(self, lora_rank: int = 0):
        """The Qwen2 LM as ``voxrelay plan``'s Llama-style layer (logits over its vocabulary). The frozen
        tokenizers run under no_grad (nothing saved for backward); the diffusion head's activations (per target
        latent x ddpm_batch_multiplier, 4 small layers) are left out; every weight counts as a parameter."""
        return decoder_shape(self.net.config.text_config, self.module, lora_rank)

    def fsdp_layer_classes(self) -> tuple[type[torch.nn.Module], ...]:
        """The LM's decoder layers and the diffusion head; the frozen tokenizers stay in the root unit."""
        return module_classes(self.module, ("Qwen2DecoderLayer", "VibeVoiceDiffusionHead"))

    # ---------------------------------------------------------------- synthesis and files

    def speak(self, request: Request, codec: Any, max_frames: int | None = None, temperature: float = 0.8,
              top_k: int | None = 50, seed: int = 0) -> Speech:
        """Speech for a ``Speaker N:`` / ``[SPEAKER_X]`` script or plain text, each speaker cloned from its voice
        prompt (``request.voice_prompts`` in speaker order; without them, a ``request.speaker`` naming voices of
        the training data takes prompts from it). Token choice is greedy (VibeVoice's; ``temperature`` and
        ``top_k`` do not apply); the diffusion noise is seeded by ``seed``."""
        check_request(self, request)
        with self.eval_weights():
            return speak(self, request, max_frames, seed)

    def spoken_text(self, text: str) -> str:
        """What a script says aloud (its turns, without speaker labels): what WER is scored against."""
        return spoken(text)

    def voice_references(self, request: Request) -> list:
        """The voice of each speaker of ``request`` (float32 at 24 kHz, the clips :meth:`speak` prompts with), for
        per-speaker similarity; empty when a speaker has none."""
        labels = parse_script(request.text)[1]
        prompts = voice_prompts(self, request, labels)
        return [waveform(self, prompts[i]) for i in range(len(labels))] if len(prompts) == len(labels) else []

    def stored_prompt(self, codec: Any, stored: np.ndarray) -> np.ndarray:
        """A held-out row's voice prompt for :meth:`speak`: stored latents as they are (synthesis conditions on
        them as training did; nothing is decoded), else the audio."""
        return np.array(stored, dtype=np.float32) if self.maker.features else codec.decode(stored)

    def save_pretrained(self, folder: str | os.PathLike[str]) -> None:
        """transformers' layout (the diffusion head's EMA weights when kept) + tokenizer + ``voxrelay.json``."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        with self.eval_weights():
            net = self.net
            gen = getattr(net, "generation_config", None)
            if gen is not None:  # what upstream generation builds its sampler from (diffusers)
                gen.noise_scheduler_class = "DPMSolverMultistepScheduler"
                gen.noise_scheduler_config = {"beta_schedule": "squaredcos_cap_v2", "prediction_type": "v_prediction"}
            if hasattr(self.module, "peft_config"):  # adapter-only export: peft's files, for transformers' class
                save_adapter(self.module, folder, self.upstream_prefix)
            else:
                net.save_pretrained(str(folder))
        self.maker.tokenizer.save_pretrained(str(folder))
        write_meta(folder, {"format_version": FORMAT_VERSION, "family": self.family, "max_length": self.max_length,
                            "settings": self.settings})


def load_meta(folder: Path) -> dict[str, Any]:
    return read_meta(folder, "vibevoice", FORMAT_VERSION)
