"""What ``voxrelay plan`` reads: the model built on the meta device (with and without LoRA) and the
sequence lengths of the prepared data (or ``--seq-len``)."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from voxrelay.config import RunConfig
from voxrelay.models.base import DataSpec, FamilyModel
from voxrelay.models.qlora import frozen_linears
from voxrelay.models.seam import module_shape
from voxrelay.plan import Lengths, ModelFacts, PlanError
from voxrelay.plan.formulas import Param, Shape


def data_spec(cfg: RunConfig, index: dict | None) -> DataSpec:
    """The prepared data's codebooks, or without prepared data what the config's codec will give."""
    needs = cfg.model.data_needs()
    if needs.codes is not None:  # a vocabulary of fixed codes (the family checks the data at build)
        return DataSpec(*needs.codes, list((index or {}).get("speakers") or []))
    if index is None:
        return DataSpec(cfg.codec.num_codebooks, cfg.codec.codebook_size)
    size = (index.get("codec") or {}).get("codebook_size")
    if size is None:
        from voxrelay.data.prepare import load_prepared_codec

        size = load_prepared_codec(cfg.prepared_uri, index).codebook_size
    return DataSpec(int(index["num_codebooks"]), int(size), list(index.get("speakers") or []),
                    codec=dict(index.get("codec") or {}))  # what the rows hold (e.g. a family's stored latents)


def read_index(cfg: RunConfig) -> dict | None:
    from voxrelay import storage
    from voxrelay.data import shards as sh
    from voxrelay.data.prepare import load_index

    if not storage.exists(storage.join(cfg.prepared_uri, sh.INDEX_FILE)):
        return None
    return load_index(cfg.prepared_uri)


def collect(module: Any, layer_classes: tuple[type, ...]) -> tuple[list[Param], tuple[int, int]]:
    """Every parameter (tied ones once) and the (params, trainable) of the largest FSDP unit: a layer of
    ``layer_classes``, or the root (whatever is in no layer: embeddings, final norm, head)."""
    import torch

    # Linears the forward runs (peft's modules_to_save keeps the replaced original beside the trained copy)
    linear = {id(m.weight) for name, m in module.named_modules()
              if isinstance(m, torch.nn.Linear) and "original_module" not in name.split(".")}
    # what train.lora.base_bits would quantise (only frozen ones count: none before LoRA freezes the base)
    quantisable = {id(getattr(parent, name).weight) for parent, name in frozen_linears(module, layer_classes)}
    units, in_layers = [], set()
    for m in module.modules():
        if layer_classes and isinstance(m, layer_classes):
            ps = list(m.parameters())
            in_layers |= {id(p) for p in ps}
            units.append((sum(p.numel() for p in ps), sum(p.numel() for p in ps if p.requires_grad)))
    params = [Param(tuple(p.shape), p.element_size(), p.requires_grad, id(p) in linear, id(p) in in_layers,
                    id(p) in quantisable) for p in module.parameters()]
    root = [p for p in module.parameters() if id(p) not in in_layers]
    units.append((sum(p.numel() for p in root), sum(p.numel() for p in root if p.requires_grad)))
    return params, max(units)


def shape_of(module: Any, lora_rank: int = 0) -> Shape:
    """The decoder sizes from the (HF Llama-style) config; ``lora_rank`` x adapted Linears per layer."""
    return module_shape(module, lora_rank)


def model_facts(cfg: RunConfig, index: dict | None) -> tuple[ModelFacts, FamilyModel]:
    """Build the model on meta (no weights), read it, apply LoRA (``train.lora`` or the family's defaults),
    read it again. Returns the facts and the (LoRA-free) family model, whose ``length`` sizes examples.
    ``model.weights_dtype: auto`` holds a LoRA base in the compute dtype: then the LoRA rows get a build of
    their own."""
    from voxrelay.models.lora import apply_lora, lora_settings
    from voxrelay.models.lora_config import LoraConfig
    from voxrelay.models.registry import as_trained, build_model

    lora_cfg = cfg.train.lora or LoraConfig()
    full_cfg = as_trained(cfg.model, cfg.train.model_copy(update={"lora": None}))
    lora_model_cfg = as_trained(cfg.model, cfg.train.model_copy(update={"lora": lora_cfg}))
    model = build_model(full_cfg, data_spec(cfg, index), cfg.train.seed, meta=True)
    layers = model.fsdp_layer_classes()
    full_params, full_unit = collect(model.module, layers)
    full_shape = model.plan_shape()
    base = model.module
    if lora_model_cfg != full_cfg:
        model.module = build_model(lora_model_cfg, data_spec(cfg, index), cfg.train.seed, meta=True).module
    rank = lora_settings(model, lora_cfg)["r"]
    # apply_lora's "frozen base in <dtype>" line is a run's, not the plan's (which prices the card's own: fp16 on
    # a T4, where this meta build says bf16: the same 2 bytes)
    lora_log = logging.getLogger("voxrelay.models.lora")
    level = lora_log.level
    lora_log.setLevel(logging.WARNING)
    try:
        apply_lora(model, lora_cfg)
    finally:
        lora_log.setLevel(level)
    lora_params, lora_unit = collect(model.module, layers)
    facts = ModelFacts({False: full_params, True: lora_params},
                       {False: full_shape, True: model.plan_shape(rank)},
                       {False: full_unit, True: lora_unit}, full_shape.vocab,
                       cfg.train.loss_chunk_tokens if cfg.train.chunked_loss and model.chunked_heads else None)
    model.module = base
    return facts, model


def lengths(cfg: RunConfig, model: FamilyModel, index: dict | None, seq_len: int | None) -> Lengths:
    """Tokens of one micro-batch: ``seq_len`` if given, else the batch budget of the prepared data (or the
    longest example, when longer: it makes a batch by itself); before any data is prepared, ``train.batch_tokens``
    (a plan before renting a card)."""
    if seq_len is not None:
        if seq_len < 1:
            raise PlanError(f"--seq-len {seq_len} must be a positive number of tokens, e.g. --seq-len 2048")
        return Lengths(seq_len, "--seq-len")
    if index is None and cfg.train.batch_tokens is not None:
        return Lengths(cfg.train.batch_tokens, "train.batch_tokens; no prepared data yet: an example longer than "
                       "that makes a bigger micro-batch, so plan again after `voxrelay prepare`")
    if index is None:
        raise PlanError(f"no prepared data at {cfg.prepared_uri} to read sequence lengths from, and "
                        "train.batch_seconds counts seconds, not tokens: run `voxrelay prepare` with this config "
                        "first, or pass --seq-len N (tokens per GPU micro-batch)")
    from voxrelay.data.rowindex import RowIndex, lengths_key, plan_lengths

    rows = RowIndex.load(cfg.prepared_uri, index, "train")  # no codes are read: the row index + cached lengths
    sizes = plan_lengths(model.length, lengths_key(cfg.model.model_dump(mode="json"), index, "train"),
                         cfg.prepared_uri, rows)
    kept = [(int(n), float(d)) for n, d in zip(sizes, rows.duration, strict=True) if n <= model.max_length]
    if not kept:
        raise PlanError(f"no training example fits {model.max_length_key}={model.max_length} "
                        f"(longest {int(sizes.max(initial=0))} tokens); raise it")
    tokens = np.array([n for n, _ in kept])
    budget = cfg.train.batch_tokens
    if budget is None:  # batch_seconds: the data's tokens per second of audio turn seconds into tokens
        budget = int(cfg.train.batch_seconds * tokens.sum() / max(sum(d for _, d in kept), 1e-9))
    longest = int(tokens.max())
    return Lengths(max(budget, longest), f"{cfg.prepared_uri} ({len(kept)} examples)", longest,
                   int(np.percentile(tokens, 95)), budget)
