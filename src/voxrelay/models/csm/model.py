"""The ``csm`` family model: conversations as examples (:mod:`.conversation`), the training forward
(:mod:`.modeling`), synthesis turn by turn with the previous turns as context through transformers' generation.

A saved folder is transformers' layout (``CsmForConditionalGeneration.from_pretrained`` loads it, Mimi included as
its ``codec_model``; ``AutoProcessor`` too when the tokenizer names CSM's audio tokens) + ``voxrelay.json``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

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
from voxrelay.models.csm import conversation as cv
from voxrelay.models.hf import read_meta, write_meta
from voxrelay.models.lora import save_adapter
from voxrelay.models.seam import FamilyModelBase

FORMAT_VERSION = 1
# the backbone's and the depth decoder's attention and MLP projections (the codec's transformer has q/k/v/o too)
LORA_TARGETS = (r".*(backbone_model|depth_decoder\.model)\.layers\.\d+\."
                r"(self_attn\.(q|k|v|o)_proj|mlp\.(gate|up|down)_proj)")
SETTINGS = ("context_turns", "train_context", "depth_decoder_frames", "max_seq_len")
# transformers' CSM chat template, as its processor renders a conversation: per message {bos}[{role}]{text}{eos},
# then the audio's placeholder when the message has audio (the processor expands it to one per frame)
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] is not string or not message['role'].isdigit() -%}"
    "{{- raise_exception('The role must be a speaker id, a string of digits such as \"0\"') -}}{%- endif -%}"
    "{{- bos_token + '[' + message['role'] + ']' -}}"
    "{%- for item in message['content'] if item['type'] == 'text' -%}{{- item['text'] -}}{%- endfor -%}"
    "{{- eos_token -}}"
    "{%- for item in message['content'] if item['type'] == 'audio' -%}{{- '<|AUDIO|><|audio_eos|>' -}}{%- endfor -%}"
    "{%- endfor -%}")


class Csm(FamilyModelBase):
    """A :class:`~voxrelay.models.base.FamilyModel` of the ``csm`` family. ``module``: a
    :class:`~voxrelay.models.csm.modeling.CsmTrainer` (its ``csm`` the transformers model); ``talks``: the
    examples' maker (tokenizer, ids, speakers, previous turns)."""

    family = "csm"
    request_fields: tuple[str, ...] = ()
    uses_corpus = True  # previous turns of a row's conversation come from the training rows
    max_length_key = "model.max_seq_len"
    upstream_prefix = "csm."  # transformers' model inside module: adapter-only exports are laid out for it
    packing_refusal = ("a position holds a text token or a whole Mimi frame, and the depth decoder learns frames "
                       "drawn per example; batches stay padded, bucketed by length")

    def __init__(self, module: Any, talks: cv.Conversations, settings: dict[str, Any]) -> None:
        self.module = module
        self.talks = talks
        self.settings = settings

    @property
    def csm(self) -> Any:
        return self.module.csm

    @property
    def speakers(self) -> list[str]:
        return self.talks.speakers

    @property
    def max_length(self) -> int:
        return self.talks.max_len

    # ---------------------------------------------------------------- training

    def use_corpus(self, rows: list) -> None:
        self.talks.use(rows)

    def length(self, row: Row) -> int:
        """Text tokens + frames of the row's turn and of the context turns it gets."""
        return self.talks.length(row)

    def example(self, row: Row) -> Example:
        return self.talks.example(row, bool(self.settings["train_context"]))

    def collate(self, examples: list[Example]) -> dict[str, torch.Tensor]:
        return cv.collate(examples, self.talks.ids, self._pad(), float(self.settings["depth_decoder_frames"]))

    def _pad(self) -> int:
        pad = self.talks.tokenizer.pad_token_id
        return int(pad if pad is not None else self.talks.tokenizer.eos_token_id)

    def loss(self, module: torch.nn.Module, batch: dict[str, torch.Tensor]) -> LossTerms:
        """``backbone``: cross-entropy of each learned frame's first codebook; ``depth``: of codebooks 1..K-1 of
        the frames the depth decoder learns this step (both summed; weights 1, as upstream adds the two means)."""
        sums = module(input_ids=batch["input_ids"], codes=batch["codes"], attention_mask=batch["attention_mask"],
                      labels=batch["labels"])
        n = cv.counts(batch["input_ids"], batch["labels"], self.talks.ids, float(self.settings["depth_decoder_frames"]))
        return {name: LossTerm(sums[name], n[name].to(sums[name].device)) for name in ("backbone", "depth")}

    def generators(self) -> dict[str, torch.Generator]:
        return {"depth_frames": self.module.generator}

    def param_groups(self, weight_decay: float) -> list[dict[str, Any]]:
        return decay_groups(self.module, weight_decay)

    def lora_defaults(self) -> LoraDefaults:
        """Adapters on the backbone's and the depth decoder's attention and MLP projections (r 32, alpha 32, as
        Unsloth's CSM notebook; not on the codec, whose transformer has projections of the same names)."""
        return LoraDefaults(r=32, alpha=32, dropout=0.0, rslora=False, target_modules=LORA_TARGETS,
                            modules_to_save=[])

    def fsdp_layer_classes(self) -> tuple[type[torch.nn.Module], ...]:
        return module_classes(self.module, ("CsmDecoderLayer",))

    def plan_shape(self, lora_rank: int = 0):
        """The backbone as ``voxrelay plan``'s Llama-style layer, logits over one codebook's vocabulary; the depth
        decoder's activations on its share of the frames priced per position outside the layers (:mod:`.plan`)."""
        from voxrelay.models.csm.plan import plan_shape

        return plan_shape(self.csm.config, self.module, lora_rank, float(self.settings["depth_decoder_frames"]))

    # ---------------------------------------------------------------- synthesis

    def spoken_text(self, text: str) -> str:
        from voxrelay.models.vibevoice.script import spoken

        return spoken(text)

    def speak(self, request: Request, codec: Any, max_frames: int | None = None, temperature: float = 0.8,
              top_k: int | None = 50, seed: int = 0) -> Speech:
        """Speech for plain text (in ``request.speaker``'s voice) or a dialogue script (``Speaker N:`` /
        ``[SPEAKER_X]`` lines): each turn generated after up to ``context_turns`` previous ones, their text and
        generated audio as context, as CSM converses; the turns' audio end to end. Seeded per turn by ``seed``."""
        from voxrelay.models.csm.generation import speak_turns

        check_request(self, request)
        return speak_turns(self, request, codec, max_frames, temperature, top_k, seed)

    # ---------------------------------------------------------------- files

    def save_pretrained(self, folder: str | os.PathLike[str]) -> None:
        """transformers' layout + tokenizer (+ CSM's processor when the tokenizer names its audio tokens) +
        ``voxrelay.json`` last."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        if hasattr(self.module, "peft_config"):  # adapter-only export: peft's files, for transformers' class
            # no tokenizer beside them: AutoPeftModel would resize the input embeddings to it, and CSM's audio
            # embeddings have no single weight (the base's own tokenizer is the adapter's)
            save_adapter(self.module, folder, self.upstream_prefix)
            write_meta(folder, {"format_version": FORMAT_VERSION, "family": self.family, "speakers": self.speakers,
                                "settings": self.settings})
            return
        self.csm.save_pretrained(str(folder))
        tokenizer = self.talks.tokenizer
        tokenizer.save_pretrained(str(folder))
        config = self.csm.config
        if tokenizer.convert_tokens_to_ids(["<|AUDIO|>", "<|audio_eos|>"]) == [config.audio_token_id,
                                                                               config.audio_eos_token_id]:
            from transformers import CsmProcessor, EncodecFeatureExtractor

            rate = int(config.codec_config.sampling_rate)
            CsmProcessor(EncodecFeatureExtractor(feature_size=1, sampling_rate=rate, padding_value=0.0), tokenizer,
                         chat_template=CHAT_TEMPLATE).save_pretrained(str(folder))
        write_meta(folder, {"format_version": FORMAT_VERSION, "family": self.family, "speakers": self.speakers,
                            "settings": self.settings})

    @classmethod
    def from_pretrained(cls, folder: str | os.PathLike[str]) -> Csm:
        from voxrelay.models.csm.loading import load_csm, load_tokenizer

        folder = Path(folder)
        meta = read_meta(folder, cls.family, FORMAT_VERSION)
        what = f"model folder {str(folder)!r}"
        return assemble(load_csm(str(folder), what), load_tokenizer(str(folder), what), list(meta["speakers"]),
                        dict(meta["settings"]), 0)


def assemble(csm: Any, tokenizer: Any, speakers: list[str], settings: dict[str, Any], seed: int) -> Csm:
    """The family model around a built ``csm`` (its depth-frame generator seeded by ``seed``)."""
    from voxrelay.models.csm.modeling import CsmTrainer

    config = csm.config
    bos, eos = (tokenizer.bos_token, tokenizer.eos_token) if tokenizer is not None else (None, None)  # plan: no text
    ids = cv.Ids(bos, eos, int(config.audio_token_id),
                 int(config.audio_eos_token_id), int(config.codebook_eos_token_id), int(config.num_codebooks))
    generator = torch.Generator().manual_seed(seed)
    module = CsmTrainer(csm, generator, float(settings["depth_decoder_frames"]))
    talks = cv.Conversations(tokenizer, ids, list(speakers), int(settings["context_turns"]),
                             int(settings["max_seq_len"]))
    return Csm(module, talks, settings)
