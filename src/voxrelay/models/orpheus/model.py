"""The ``orpheus`` family: the causal_lm family's ``orpheus`` layout (``models/causal_lm/layouts/orpheus.yaml``:
Orpheus-TTS' exact sequence layout, see also :mod:`.layout`) under its own name, keys and saved folders.

It stays a family of its own so that every ``model.family: orpheus`` config, run and saved folder keeps working
as it did (its keys, resume checks and folders predate layouts); everything it computes is the layout model's,
and ``tests/unit/models/test_orpheus_golden.py`` holds it to what the family did before (bit for bit on the
examples and generations). A saved folder is an HF folder upstream code loads as is (``LlamaForCausalLM`` /
``AutoTokenizer.from_pretrained``) with ``voxrelay.json`` written last.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from voxrelay.models.causal_lm.layout import load_layout
from voxrelay.models.causal_lm.model import LayoutLM
from voxrelay.models.hf import load_causal_lm, read_meta

FORMAT_VERSION = 1
LAYOUT = "orpheus"
LORA_TARGETS = list(load_layout(LAYOUT).lora.target_modules)  # upstream's LoRA (finetune/lora.py): every projection


class Orpheus(LayoutLM):
    """A :class:`~voxrelay.models.base.FamilyModel` of the ``orpheus`` family: the ``orpheus`` layout's model.

    ``module``: a ``LlamaForCausalLM`` with 156,940 embedding rows; ``tokenizer``: the Llama-3 tokenizer with
    Orpheus' custom tokens; ``speakers``: voices of the training data (the prompt is ``"{speaker}: {text}"``).
    """

    family = "orpheus"

    def __init__(self, module: Any, tokenizer: Any, speakers: list[str], max_seq_len: int, loss_on: str,
                 drop_duplicates: bool = True) -> None:
        super().__init__(module, tokenizer, load_layout(LAYOUT), speakers, max_seq_len, loss_on, drop_duplicates)

    def meta(self) -> dict[str, Any]:
        """``voxrelay.json`` as the family always wrote it (no layout: the family is the layout)."""
        return {"format_version": FORMAT_VERSION, "family": self.family, "speakers": list(self.speakers),
                "max_seq_len": self.max_length, "loss_on": self.loss_on}

    @classmethod
    def from_pretrained(cls, folder: str | os.PathLike[str]) -> Orpheus:
        """Load a folder written by :meth:`save_pretrained` (no network access)."""
        from voxrelay.models.orpheus.loading import load_tokenizer

        folder = Path(folder)
        meta = read_meta(folder, "orpheus", FORMAT_VERSION)
        module = load_causal_lm(str(folder), f"model folder {str(folder)!r}", attn_implementation="sdpa")
        tokenizer = load_tokenizer(str(folder), f"model folder {str(folder)!r}")
        return cls(module, tokenizer, list(meta["speakers"]), int(meta["max_seq_len"]), meta["loss_on"])
