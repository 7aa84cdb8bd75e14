"""The codec LM: a decoder-only transformer over ``[BOS, text, AUDIO_START, codes..., AUDIO_END]``.

As in Orpheus, the audio codes of a frame are flattened codebook by codebook (frame 0: k = 0..K-1,
then frame 1, ...) and each codebook has its own id range (see :class:`VocabLayout`). The loss is
taken on audio ids and AUDIO_END only. With known speakers the text is prefixed by the speaker
name as plain text (``"en-us+m3: Hello"``), which works with any text tokenizer.

A saved folder holds ``model.safetensors`` + ``config.json`` (``LlamaForCausalLM.from_pretrained``
loads it), ``tokenizer/`` and ``voxrelay.json`` (written last: the folder is usable once it exists).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, PreTrainedModel

from voxrelay.errors import UserError, one_line
from voxrelay.models.codec_lm.config import CodecLMConfig
from voxrelay.models.codec_lm.tokenizer import (
    TextTokenizer,
    load_saved_tokenizer,
    load_text_tokenizer,
    looks_local,
)
from voxrelay.models.codec_lm.vocab import VocabLayout
from voxrelay.paths import EXPORT_META

FORMAT_VERSION = 1
META_FILE = EXPORT_META
TOKENIZER_DIR = "tokenizer"
IGNORE_INDEX = -100


class SequenceTooLongError(UserError, ValueError):
    """An utterance does not fit in ``model.max_seq_len`` tokens."""


class ModelLoadError(UserError, ValueError):
    """``model.init_from`` or a saved model folder cannot be loaded; the message names it and the fix."""


class ModelNotFoundError(ModelLoadError, FileNotFoundError):
    """A model folder that does not exist or was not written completely."""


class CodecLM:
    """A causal LM over text + codec ids, with its tokenizer, id layout and known speakers.

    ``module`` is the ``transformers`` model (a ``LlamaForCausalLM`` when built from scratch);
    ``max_seq_len`` bounds training sequences and generation (text + audio ids).
    """

    def __init__(
        self,
        module: PreTrainedModel,
        tokenizer: TextTokenizer,
        layout: VocabLayout,
        speakers: list[str],
        max_seq_len: int,
    ) -> None:
        self.module = module
        self.tokenizer = tokenizer
        self.layout = layout
        self.speakers = speakers
        self.max_seq_len = max_seq_len

    # ---------------------------------------------------------------- construction and files

    @classmethod
    def build(
        cls,
        model_cfg: CodecLMConfig,
        num_codebooks: int,
        codebook_size: int,
        speakers: list[str],
        seed: int,
    ) -> CodecLM:
        """A new model: random init seeded by ``seed``, or weights from ``model_cfg.init_from``.

        ``init_from`` may be a plain causal-LM folder / hub id (its embeddings are resized to add
        the special and audio ids; ``model.tokenizer`` must be that model's tokenizer) or a folder
        written by :meth:`save_pretrained` (fine-tuning a voxrelay model; its layout is kept).
        The global torch RNG is left untouched.
        """
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            if model_cfg.init_from:
                module, tokenizer, layout = _load_init(model_cfg, num_codebooks, codebook_size)
            else:
                tokenizer = load_text_tokenizer(model_cfg.tokenizer)
                layout = VocabLayout(tokenizer.vocab_size, num_codebooks, codebook_size)
                module = LlamaForCausalLM._from_config(_llama_config(model_cfg, layout), attn_implementation="sdpa")
        return cls(module, tokenizer, layout, list(speakers), model_cfg.max_seq_len)

    def save_pretrained(self, folder: str | os.PathLike[str]) -> None:
        """Write weights + config.json, ``tokenizer/`` and, last, ``voxrelay.json`` into a local folder."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.module.save_pretrained(str(folder))
        self.tokenizer.save(folder / TOKENIZER_DIR)
        meta = {
            "format_version": FORMAT_VERSION,
            "family": "codec_lm",
            "tokenizer": self.tokenizer.spec,
            "layout": self.layout.to_dict(),
            "speakers": list(self.speakers),
            "max_seq_len": self.max_seq_len,
        }
        tmp = folder / (META_FILE + ".tmp")
        tmp.write_text(json.dumps(meta, indent=2))
        tmp.replace(folder / META_FILE)

    @classmethod
    def from_pretrained(cls, folder: str | os.PathLike[str]) -> CodecLM:
        """Load a folder written by :meth:`save_pretrained` (no network access)."""
        folder = Path(folder)
        meta = _read_meta(folder)
        layout = VocabLayout.from_dict(meta["layout"])
        tokenizer = load_saved_tokenizer(folder / TOKENIZER_DIR)
        module = load_causal_lm(str(folder), f"model folder {str(folder)!r}", attn_implementation="sdpa")
        return cls(module, tokenizer, layout, list(meta["speakers"]), int(meta["max_seq_len"]))

    # ---------------------------------------------------------------- training data

    def prompt_text(self, text: str, speaker: str | None) -> str:
        """The text the LM reads: ``"<speaker>: <text>"`` when the model knows speakers, else ``text``.

        A model built with no speakers ignores ``speaker`` (it has no speaker conditioning).
        """
        if not self.speakers or speaker is None:
            return text
        if speaker not in self.speakers:
            shown = ", ".join(repr(s) for s in self.speakers[:10])
            raise ValueError(f"unknown speaker {speaker!r}; this model knows {len(self.speakers)}: {shown}")
        return f"{speaker}: {text}"

    def _prompt_ids(self, text: str, speaker: str | None) -> list[int]:
        """``[BOS, text ids..., AUDIO_START]``."""
        text_ids = self.tokenizer.encode(self.prompt_text(text, speaker))
        return [self.layout.bos_id, *text_ids, self.layout.audio_start_id]

    def sequence_length(self, text: str, num_frames: int, speaker: str | None = None) -> int:
        """Tokens of the training sequence of an utterance (prompt + K * num_frames + AUDIO_END).

        Does not check ``max_seq_len``, so that a batch planner can filter long utterances.
        """
        return len(self._prompt_ids(text, speaker)) + num_frames * self.layout.num_codebooks + 1

    def encode_example(self, text: str, codes: np.ndarray, speaker: str | None = None) -> dict[str, np.ndarray]:
        """text + codes int [K, T] -> ``input_ids`` int64 [L] and ``labels`` int64 [L].

        ``labels`` equal ``input_ids`` on audio ids and AUDIO_END, and -100 on BOS, text and
        AUDIO_START (no loss there). L = prompt length + K * T + 1.
        """
        prompt = self._prompt_ids(text, speaker)
        audio = self.layout.codes_to_ids(codes)
        length = len(prompt) + audio.size + 1
        if length > self.max_seq_len:
            raise SequenceTooLongError(
                f"utterance {text[:40]!r} ({np.asarray(codes).shape[1]} frames, {len(prompt) - 2} text tokens) "
                f"needs {length} tokens but model.max_seq_len is {self.max_seq_len}; raise model.max_seq_len "
                "or lower data.max_duration"
            )
        input_ids = np.concatenate(
            [np.asarray(prompt, dtype=np.int64), audio, np.asarray([self.layout.audio_end_id], dtype=np.int64)]
        )
        labels = input_ids.copy()
        labels[: len(prompt)] = IGNORE_INDEX
        return {"input_ids": input_ids, "labels": labels}

    def collate(self, examples: list[dict[str, np.ndarray]]) -> dict[str, torch.Tensor]:
        """Right-pad examples of :meth:`encode_example` into a batch.

        Returns ``input_ids`` int64 [B, Lmax] (PAD after the end), ``attention_mask`` int64 [B, Lmax]
        (1 on real tokens) and ``labels`` int64 [B, Lmax] (-100 on padding).
        """
        if not examples:
            raise ValueError("collate needs at least one example")
        lmax = max(len(e["input_ids"]) for e in examples)
        input_ids = torch.full((len(examples), lmax), self.layout.pad_id, dtype=torch.long)
        labels = torch.full((len(examples), lmax), IGNORE_INDEX, dtype=torch.long)
        attention_mask = torch.zeros((len(examples), lmax), dtype=torch.long)
        for i, e in enumerate(examples):
            n = len(e["input_ids"])
            input_ids[i, :n] = torch.as_tensor(e["input_ids"], dtype=torch.long)
            labels[i, :n] = torch.as_tensor(e["labels"], dtype=torch.long)
            attention_mask[i, :n] = 1
        return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}

    def loss(self, module: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Summed next-token cross-entropy over labelled positions, and their count.

        ``module`` is the (possibly accelerate/DDP/FSDP-wrapped) ``self.module``; ``batch`` comes from
        :meth:`collate`, already on the module's device. Returns ``(loss_sum, num_tokens)``: a float32
        scalar and an int64 scalar, so the loop can divide by the token count of a whole
        gradient-accumulation window.
        """
        out = module(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False)
        targets = batch["labels"][:, 1:]
        keep = targets != IGNORE_INDEX
        # Only labelled positions reach the (float32) softmax: saves memory on text and padding.
        logits = out.logits[:, :-1][keep].float()  # [N, V]
        loss_sum = F.cross_entropy(logits, targets[keep], reduction="sum")
        return loss_sum, keep.sum()

    # ---------------------------------------------------------------- synthesis

    @torch.no_grad()
    def generate(
        self,
        text: str,
        speaker: str | None = None,
        max_frames: int | None = None,
        temperature: float = 0.8,
        top_k: int | None = 50,
        seed: int = 0,
    ) -> np.ndarray:
        """Sample codes int64 [K, T] for ``text`` (T >= 1), deterministic for a ``seed``.

        Decoding is constrained: each position may only take ids of the codebook due next, and
        AUDIO_END only at a frame boundary after at least one frame. Stops at AUDIO_END or after
        ``max_frames`` frames; ``max_frames`` is capped so the sequence fits ``max_seq_len``.
        ``temperature <= 0`` is greedy; ``top_k`` None or 0 samples from the whole codebook.
        """
        prompt = self._prompt_ids(text, speaker)
        budget = (self.max_seq_len - len(prompt) - 1) // self.layout.num_codebooks
        if budget < 1:
            raise SequenceTooLongError(
                f"the prompt of {text[:40]!r} takes {len(prompt)} tokens, leaving no room for one frame "
                f"in model.max_seq_len={self.max_seq_len}; shorten the text"
            )
        if max_frames is not None and max_frames < 1:
            raise ValueError(f"max_frames must be >= 1 (or None for the max_seq_len bound), got {max_frames}")
        max_frames = budget if max_frames is None else min(max_frames, budget)
        was_training = self.module.training
        self.module.eval()
        try:
            ids = self._decode(prompt, max_frames, temperature, top_k, seed)
        finally:
            self.module.train(was_training)
        return self.layout.ids_to_codes(np.asarray(ids, dtype=np.int64))

    def _decode(
        self, prompt: list[int], max_frames: int, temperature: float, top_k: int | None, seed: int
    ) -> list[int]:
        """The KV-cached sampling loop; returns the audio ids (whole frames, AUDIO_END excluded)."""
        layout, k_books = self.layout, self.layout.num_codebooks
        device = next(self.module.parameters()).device
        generator = torch.Generator(device=device).manual_seed(seed)
        step_input = torch.tensor([prompt], dtype=torch.long, device=device)
        past: Any = None
        audio: list[int] = []
        while len(audio) < max_frames * k_books:
            out = self.module(input_ids=step_input, past_key_values=past, use_cache=True)
            past = out.past_key_values
            logits = out.logits[0, -1].float()  # [V]
            k = len(audio) % k_books
            lo, hi = layout.codebook_range(k)
            can_end = k == 0 and len(audio) > 0
            candidates = logits[lo:hi]
            if can_end:
                candidates = torch.cat([candidates, logits[layout.audio_end_id : layout.audio_end_id + 1]])
            choice = _sample(candidates, temperature, top_k, generator)
            if can_end and choice == hi - lo:
                break
            audio.append(lo + choice)
            step_input = torch.tensor([[lo + choice]], dtype=torch.long, device=device)
        return audio


def _sample(logits: torch.Tensor, temperature: float, top_k: int | None, generator: torch.Generator) -> int:
    """Index into ``logits`` [N]: argmax when ``temperature <= 0``, else top-k sampling."""
    if temperature <= 0:
        return int(torch.argmax(logits))
    scaled = logits / temperature
    if top_k and top_k < scaled.numel():
        values, indices = torch.topk(scaled, top_k)
        pick = torch.multinomial(torch.softmax(values, dim=-1), 1, generator=generator)
        return int(indices[pick])
    return int(torch.multinomial(torch.softmax(scaled, dim=-1), 1, generator=generator))


def _llama_config(cfg: CodecLMConfig, layout: VocabLayout) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=layout.vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_heads,
        max_position_embeddings=cfg.max_seq_len,
        attention_dropout=cfg.dropout,
        tie_word_embeddings=False,
        pad_token_id=layout.pad_id,
        bos_token_id=layout.bos_id,
        eos_token_id=layout.audio_end_id,
    )


def _read_meta(folder: Path) -> dict[str, Any]:
    path = folder / META_FILE
    if not path.is_file():
        raise ModelNotFoundError(
            f"{path} is missing: {folder} is not a complete voxrelay codec_lm folder "
            "(save_pretrained writes voxrelay.json last; an interrupted save leaves none)"
        )
    try:
        meta = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ModelLoadError(f"{path} is not valid JSON ({e}); save the model again") from e
    if meta.get("format_version") != FORMAT_VERSION:
        raise ModelLoadError(
            f"{path}: format_version {meta.get('format_version')!r} is not supported by this voxrelay "
            f"(expects {FORMAT_VERSION}); load it with the voxrelay version that wrote it"
        )
    return meta


def _load_init(
    cfg: CodecLMConfig, num_codebooks: int, codebook_size: int
) -> tuple[PreTrainedModel, TextTokenizer, VocabLayout]:
    """Weights, tokenizer and layout for ``cfg.init_from`` (a voxrelay folder or a plain causal LM)."""
    source = str(cfg.init_from)
    kwargs = {"attn_implementation": "sdpa", "attention_dropout": cfg.dropout}
    if (Path(source) / META_FILE).is_file():
        meta = _read_meta(Path(source))
        layout = VocabLayout.from_dict(meta["layout"])
        if (layout.num_codebooks, layout.codebook_size) != (num_codebooks, codebook_size):
            raise ModelLoadError(
                f"model.init_from={source!r} was trained on {layout.num_codebooks} codebooks x "
                f"{layout.codebook_size} codes but the data has {num_codebooks} x {codebook_size}; "
                "prepare the data with the same codec or start from another model"
            )
        if meta["tokenizer"] != cfg.tokenizer:
            raise ModelLoadError(
                f"model.init_from={source!r} uses tokenizer {meta['tokenizer']!r} but model.tokenizer is "
                f"{cfg.tokenizer!r}; set model.tokenizer={meta['tokenizer']}"
            )
        tokenizer = load_saved_tokenizer(Path(source) / TOKENIZER_DIR)
        return load_causal_lm(source, "model.init_from", **kwargs), tokenizer, layout
    tokenizer = load_text_tokenizer(cfg.tokenizer)
    module = load_causal_lm(source, "model.init_from", **kwargs)
    lm_vocab = module.get_input_embeddings().weight.shape[0]
    if tokenizer.vocab_size > lm_vocab:
        raise ModelLoadError(
            f"model.tokenizer={cfg.tokenizer!r} has {tokenizer.vocab_size} ids but model.init_from={source!r} "
            f"embeds only {lm_vocab}; set model.tokenizer to the tokenizer of {source!r}"
        )
    # Special and audio ids go after every row the pretrained model has, so no text row is reused.
    layout = VocabLayout(lm_vocab, num_codebooks, codebook_size)
    module.resize_token_embeddings(layout.vocab_size)
    module.config.pad_token_id = layout.pad_id
    module.config.bos_token_id = layout.bos_id
    module.config.eos_token_id = layout.audio_end_id
    return module, tokenizer, layout


def load_causal_lm(source: str, what: str, **kwargs: Any) -> PreTrainedModel:
    """``AutoModelForCausalLM.from_pretrained(source)`` whose failures name ``what`` (e.g. ``model.init_from``)
    and the fix; weights that leave part of the model random are refused rather than trained on."""
    folder = Path(source).expanduser()
    fix = "point it at a folder written by save_pretrained (config.json + model.safetensors) or at a HF hub id"
    if not folder.is_dir() and looks_local(source):
        raise ModelNotFoundError(f"{what}={source!r}: no such folder (and not a hub id); {fix}")
    if folder.is_dir() and not (folder / "config.json").is_file():
        raise ModelNotFoundError(f"{what}={source!r}: the folder has no config.json; {fix}")
    where = "local folder" if folder.is_dir() else "hub id (it is not a local folder)"
    try:
        module, info = AutoModelForCausalLM.from_pretrained(
            str(folder) if folder.is_dir() else source, output_loading_info=True, **kwargs
        )
    except OSError as e:  # no weights file, or a hub id that cannot be fetched
        raise ModelNotFoundError(f"{what}={source!r} cannot be loaded as a {where} ({one_line(e)}); {fix}") from e
    except (ValueError, KeyError) as e:  # config.json of no known causal LM
        raise ModelLoadError(f"{what}={source!r} is not a causal LM ({one_line(e)[:300]}); {fix}") from e
    except RuntimeError as e:  # weights whose shapes disagree with config.json
        raise ModelLoadError(
            f"{what}={source!r}: its weights do not fit its config.json ({one_line(e)[:300]}); {fix}"
        ) from e
    missing = list(info.get("missing_keys") or [])
    if missing:
        raise ModelLoadError(
            f"{what}={source!r}: its weights lack {len(missing)} tensors of the model its config.json describes "
            f"(e.g. {sorted(missing)[:3]}), which would start random; {fix}"
        )
    return module
