"""Build and load :class:`LayoutLM` models (the ``causal_lm`` spec's ``build`` and ``load``)."""

from __future__ import annotations

import os

import torch

from voxrelay.errors import ConfigError
from voxrelay.models.base import DataSpec
from voxrelay.models.causal_lm.config import CausalLMConfig
from voxrelay.models.causal_lm.layout import Layout
from voxrelay.models.causal_lm.loading import (
    add_extra,
    build_module,
    load_tokenizer,
    meta_module,
    rows_needed,
    tokenizer_source,
)
from voxrelay.models.causal_lm.model import LayoutLM
from voxrelay.models.causal_lm.tokens import resolve
from voxrelay.models.hf import auto_config


def build(cfg: CausalLMConfig, data: DataSpec, seed: int, meta: bool = False) -> LayoutLM:
    layout = cfg.resolved()
    check_data(layout, data)
    source = tokenizer_source(cfg, layout)
    what = "model.tokenizer" if cfg.tokenizer else "model.init_from"
    tokenizer = load_tokenizer(source, what, layout)  # planning needs it too: it sizes examples and ids
    if layout.vocab_size is not None and len(tokenizer) > layout.vocab_size:
        raise ConfigError(f"layout {layout.name}: vocab_size {layout.vocab_size} is smaller than its tokenizer "
                          f"({len(tokenizer)} ids with the layout's tokens); raise vocab_size or leave it out")
    first_added = add_extra(tokenizer, cfg.add_tokens)
    rows = rows_needed(layout, len(tokenizer))
    found = resolve(layout, tokenizer)
    ids = {"pad_token_id": found.pad, "bos_token_id": found.bos, "eos_token_id": found.stop}  # the config's
    if meta:  # `plan`: the shapes come from config.json
        module = meta_module(cfg, layout, rows, ids)
    else:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            module = build_module(cfg, layout, rows, ids)
    loss_on = cfg.loss_on or layout.loss_on
    drop = layout.drop_repeated_frames if cfg.drop_repeated_frames is None else cfg.drop_repeated_frames
    speakers = list(data.speakers) if layout.speaker_format else []  # a layout without speakers knows no voice
    model = LayoutLM(module, tokenizer, layout, speakers, cfg.seq_len(), loss_on, drop)
    model.ids = found  # resolved once (LayoutLM resolves them itself when loaded from a folder)
    model.new_rows = new_rows(cfg, rows, first_added if len(tokenizer) > first_added else rows)
    return model


def load(folder: str | os.PathLike[str]) -> LayoutLM:
    return LayoutLM.from_pretrained(folder)


def new_rows(cfg: CausalLMConfig, rows: int, first_added: int) -> tuple[int, int]:
    """The ids whose rows ``init_from`` never trained ([start, end)): those the build grew onto it (the layout's
    when it is the base LM) and those ``model.add_tokens`` added from ``first_added`` on (a spare row the checkpoint
    has, as Orpheus' one, included); none for a random init."""
    if cfg.init_from is None:
        return (0, 0)
    start = min(auto_config(cfg.init_from).vocab_size, first_added)
    return (start, rows) if start < rows else (0, 0)


def check_data(layout: Layout, data: DataSpec) -> None:
    """The layout's ids hold K codes of its codebook size per frame of its codec: the data must be that codec's."""
    kind = (data.codec or {}).get("type")
    if kind is not None and kind != layout.codec.type:
        raise ConfigError(
            f"layout {layout.name} speaks the {layout.codec.type} codec, but the prepared data holds {kind} codes; "
            f"prepare with codec.type={layout.codec.type}" + (f" codec.path={layout.codec.path}"
                                                               if layout.codec.path else "")
            + " under another data.name")
    if (data.num_codebooks, data.codebook_size) != (layout.codebooks, layout.codebook_size):
        raise ConfigError(
            f"layout {layout.name} needs codes of {layout.codebooks} x {layout.codebook_size} per frame "
            f"(codec.type={layout.codec.type}" + (f", codec.path={layout.codec.path}" if layout.codec.path else "")
            + f") but the prepared data has {data.num_codebooks} x {data.codebook_size}; prepare with that codec "
            "under another data.name")

