"""Synthesis from a run folder (latest checkpoint or a given step) or an exported folder, and export.

An export folder holds what the model's family writes (``save_pretrained``; for a Llama-based family
``model.safetensors`` + transformers ``config.json``, loadable by ``LlamaForCausalLM.from_pretrained``),
``voxrelay.json`` (family, tokenizer, vocabulary layout, speakers) and ``codec.json``
(+ ``codec.safetensors`` for the built-in codec). Models are reached only through the family seam
(:mod:`voxrelay.models.base`).

A run trained with ``train.lora`` is exported merged (the adapters folded into the base: a plain model of
its family) unless ``adapter_only``: then the folder holds peft's ``adapter_config.json`` +
``adapter_model.safetensors`` with the family's other files, and ``voxrelay.json`` gains a ``lora`` note
saying how to rebuild the base (the run's ``model`` section, data spec and seed, so ``init_from`` or the
seeded random init) and its hash; synthesis rebuilds that base, checks the hash and adds the adapters.
"""

from __future__ import annotations

from voxrelay.inference.export import check_export_output, export, export_run  # noqa: F401
from voxrelay.inference.load import (  # noqa: F401
    BASE_BITS,
    CODEC_JSON,
    CODEC_STATE,
    LORA_NOTE,
    VOXRELAY_FORMAT,
    InferenceError,
    load_any,
    load_from_export,
    load_from_run,
    run_config,
)
from voxrelay.inference.speak import (  # noqa: F401
    build_request,
    check_sampling_args,
    check_synthesis_args,
    check_voice_prompts,
    read_text_or_script,
    read_voice_prompts,
    synthesize,
)
