"""Tiny stand-ins of CSM's parts, built the way the real ones are (no download): sesame/csm-1b's tokenizer layout
(Llama-3's 128,256 ids, <|AUDIO|> 128002 and <|audio_eos|> 128003, EOS <|end_of_text|>) and the model sizes of a
random CSM small enough for a CPU test."""

from __future__ import annotations

from pathlib import Path

from tests.helpers.orpheus import save_llama3_tokenizer

CSM_NAMES = {2: "<|AUDIO|>", 3: "<|audio_eos|>"}  # reserved special tokens 0 and 1 of Llama-3, as csm-1b names them
TINY_CSM = {"hidden_size": 32, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "intermediate_size": 64,
            "depth_hidden_size": 16, "depth_layers": 1, "depth_heads": 2, "depth_intermediate_size": 32}


def save_csm_tokenizer(folder: Path) -> Path:
    """csm-1b's tokenizer layout; its padding token is its EOS, as csm-1b's."""
    from transformers import AutoTokenizer

    save_llama3_tokenizer(folder, names=CSM_NAMES, eos="<|end_of_text|>")
    tok = AutoTokenizer.from_pretrained(str(folder))
    tok.pad_token = "<|end_of_text|>"
    tok.save_pretrained(str(folder))
    return folder
