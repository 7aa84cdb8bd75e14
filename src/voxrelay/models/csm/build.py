"""Build a :class:`~voxrelay.models.csm.model.Csm` (the ``csm`` spec's ``build``)."""

from __future__ import annotations

from typing import Any

from voxrelay.models.base import DataSpec
from voxrelay.models.csm.config import CsmConfig
from voxrelay.models.csm.loading import build_csm, load_tokenizer
from voxrelay.models.csm.model import SETTINGS, Csm, assemble
from voxrelay.models.hf import ModelLoadError


def build(cfg: CsmConfig, data: DataSpec, seed: int, meta: bool = False) -> Csm:
    """``cfg``'s model for ``data``: init_from's weights or random (seeded by ``seed``); the global RNG untouched.
    ``meta``: shapes only (``plan``), the tokenizer when it is at hand."""
    what = "model.tokenizer" if cfg.tokenizer else "model.init_from"
    source = cfg.tokenizer or cfg.init_from
    if source is None:
        raise ModelLoadError("model.family=csm needs model.init_from (e.g. sesame/csm-1b) or, for a random model, "
                             "model.tokenizer (a Llama-3 tokenizer)")
    tokenizer: Any
    try:
        tokenizer = load_tokenizer(source, what)
    except ModelLoadError:
        if not meta:
            raise
        tokenizer = None
    csm = build_csm(cfg, tokenizer, data, seed, meta)
    settings = {key: getattr(cfg, key) for key in SETTINGS}
    model = assemble(csm, tokenizer, list(data.speakers), settings, seed)
    return model
