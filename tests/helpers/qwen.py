"""A tokenizer with Qwen2.5's id layout, built the way the real one is (no download): byte-level BPE, 151,643
regular ids (a few hundred real tokens, the rest unreachable fillers), then Qwen's 22 special tokens from
<|endoftext|> 151643 (its pad) to 151664: 151,665 ids."""

from __future__ import annotations

import json
from pathlib import Path

QWEN_VOCAB = 151_665
ENDOFTEXT = 151_643
TEXTS = ["user: Convert the text to speech:", "assistant:", "dˈɪd fˈiːlɪks kˈæɹi ɪt? həlˈoʊ, wˈɜːld.",
         "The quick brown fox jumps over the lazy dog."]
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
            "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>",
            "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>",
            "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"]


def save_qwen2_tokenizer(folder: Path) -> Path:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(TEXTS * 10, trainers.BpeTrainer(vocab_size=500, show_progress=False,
                                                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    spec = json.loads(tok.to_str())
    vocab = spec["model"]["vocab"]
    vocab.update({f"<|filler_{i}|>": i for i in range(len(vocab), ENDOFTEXT)})
    tok = Tokenizer.from_str(json.dumps(spec))
    tok.add_special_tokens([AddedToken(s, special=True) for s in SPECIALS])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    assert len(fast) == QWEN_VOCAB and fast.convert_tokens_to_ids("<|endoftext|>") == ENDOFTEXT
    fast.save_pretrained(str(folder))
    return folder
