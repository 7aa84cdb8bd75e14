"""Build and load :class:`Orpheus` models (the ``orpheus`` spec's ``build`` and ``load``)."""

from __future__ import annotations

import os

import torch

from voxrelay.errors import ConfigError
from voxrelay.models.base import DataSpec
from voxrelay.models.hf import ModelLoadError, auto_config
from voxrelay.models.orpheus import layout as L
from voxrelay.models.orpheus.config import OrpheusConfig
from voxrelay.models.orpheus.loading import build_module, load_tokenizer, meta_module, tokenizer_source
from voxrelay.models.orpheus.model import Orpheus


def build(cfg: OrpheusConfig, data: DataSpec, seed: int, meta: bool = False) -> Orpheus:
    check_data(data)
    source = tokenizer_source(cfg)
    what = "model.tokenizer" if cfg.tokenizer else "model.init_from"
    if meta:  # `plan`: the shapes come from config.json; a tokenizer only sizes examples (--seq-len needs none)
        try:
            tokenizer = load_tokenizer(source, what)
        except ModelLoadError as err:
            tokenizer = MissingTokenizer(f"{err}; or give `voxrelay plan` --seq-len N (tokens per GPU micro-batch)")
        module = meta_module(cfg)
    else:
        tokenizer = load_tokenizer(source, what)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            module = build_module(cfg)
    model = Orpheus(module, tokenizer, list(data.speakers), cfg.max_seq_len, cfg.loss_on, cfg.drop_duplicate_frames)
    model.new_rows = new_rows(cfg)
    return model

def load(folder: str | os.PathLike[str]) -> Orpheus:
    return Orpheus.from_pretrained(folder)


def new_rows(cfg: OrpheusConfig) -> tuple[int, int]:
    """The ids the build grew onto ``init_from`` ([start, end)): Orpheus' when it is a plain Llama-3, none for an
    Orpheus checkpoint (its audio tokens are there) or a random init (nothing pretrained to keep)."""
    if cfg.init_from is None:
        return (0, 0)
    rows = auto_config(cfg.init_from).vocab_size
    return (rows, L.VOCAB_SIZE) if rows < L.TOKENIZER_SIZE else (0, 0)


class MissingTokenizer:
    """Stands in for a tokenizer that could not be loaded where none is needed (a model built on meta to price its
    memory); anything that tokenizes raises the load's error."""

    def __init__(self, why: str):
        self.why = why

    def __getattr__(self, name: str):
        raise ModelLoadError(self.why)


def check_data(data: DataSpec) -> None:
    """Orpheus' ids hold 7 codes of 4,096 per frame: the data must be SNAC with vq_strides [4, 2, 1]."""
    if (data.num_codebooks, data.codebook_size) != (L.CODES_PER_FRAME, L.CODEBOOK_SIZE):
        raise ConfigError(
            f"model.family=orpheus needs SNAC codes (7 per frame, 4096 each: codec.type=snac, "
            f"codec.path=hubertsiuzdak/snac_24khz) but the prepared data has {data.num_codebooks} x "
            f"{data.codebook_size}; prepare with that codec under another data.name"
        )
