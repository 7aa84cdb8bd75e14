"""Tiny stand-ins of Orpheus' parts, built the way the real ones are (no download): a Llama-3-style tokenizer
(byte-level BPE, 128,000 regular ids, Llama-3's 256 special tokens at 128000..128255), a tiny random
LlamaForCausalLM with Orpheus' vocabulary (or a plain Llama-3 one), and a tiny random SNAC at 24 kHz with
4,096 codes per codebook and Orpheus' strides [4, 2, 1]."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from voxrelay.models.orpheus import layout as L

TEXTS = ["Hello world, this is a tiny tokenizer for tests.", "The quick brown fox jumps over the lazy dog.",
         "tara: <laugh> well, <sigh> that was something!"]
SPECIAL_NAMES = {0: "<|begin_of_text|>", 1: "<|end_of_text|>", 6: "<|start_header_id|>", 7: "<|end_header_id|>",
                 9: "<|eot_id|>"}
TINY_LLAMA = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=1, max_position_embeddings=2048, rope_theta=500000.0)
TINY_SNAC = dict(sampling_rate=24000, encoder_dim=8, encoder_rates=[8, 8, 8], decoder_dim=32, decoder_rates=[8, 8, 8],
                 attn_window_size=None, codebook_size=4096, codebook_dim=4, vq_strides=[4, 2, 1])


def save_llama3_tokenizer(folder: Path, names: dict[int, str] | None = None, eos: str = "<|eot_id|>") -> Path:
    """A tokenizer with Llama-3's id layout: 128,256 ids, BOS <|begin_of_text|> 128000 added in front,
    <|eot_id|> 128009 (a few hundred real BPE tokens, the rest unreachable fillers). ``names``: special tokens
    named otherwise (offset from 128000, e.g. CSM's {2: "<|AUDIO|>"}); ``eos``: the EOS token."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(TEXTS * 10, trainers.BpeTrainer(vocab_size=400, show_progress=False,
                                                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    spec = json.loads(tok.to_str())
    vocab = spec["model"]["vocab"]
    vocab.update({f"<|filler_{i}|>": i for i in range(len(vocab), L.BOS)})
    tok = Tokenizer.from_str(json.dumps(spec))
    reserved = iter(range(256))
    base = [SPECIAL_NAMES.get(i) or f"<|reserved_special_token_{next(reserved)}|>" for i in range(256)]
    tok.add_special_tokens([AddedToken((names or {}).get(i, name), special=True) for i, name in enumerate(base)])
    tok.post_processor = processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                                       special_tokens=[("<|begin_of_text|>", L.BOS)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|begin_of_text|>", eos_token=eos)
    assert len(fast) == L.LLAMA3_VOCAB
    fast.save_pretrained(str(folder))
    return folder


def save_tiny_llama(folder: Path, tokenizer: Path, orpheus: bool = True, seed: int = 0) -> Path:
    """A tiny random LlamaForCausalLM + tokenizer: Orpheus' vocabulary (156,940 rows, the custom tokens in the
    tokenizer) or, with ``orpheus=False``, a plain Llama-3 one (128,256 rows)."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    vocab = L.VOCAB_SIZE if orpheus else L.LLAMA3_VOCAB
    module = LlamaForCausalLM(LlamaConfig(vocab_size=vocab, tie_word_embeddings=True, bos_token_id=L.BOS,
                                          eos_token_id=L.END_OF_TEXT, **TINY_LLAMA))
    module.save_pretrained(str(folder))
    tok = AutoTokenizer.from_pretrained(str(tokenizer))
    if orpheus:
        tok.add_tokens([f"<custom_token_{i}>" for i in range(L.NUM_CUSTOM_TOKENS)])
    tok.save_pretrained(str(folder))
    return folder


def save_tiny_snac(folder: Path) -> Path:
    from safetensors.torch import save_file
    from snac import SNAC

    torch.manual_seed(0)
    model = SNAC(**TINY_SNAC).eval()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(TINY_SNAC))
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, folder / "model.safetensors")
    return folder


# Llama-3.2-Instruct's chat template, transcribed in its structure (the hub's file is not reachable here): BOS, a
# system turn dated by strftime_now unless date_string is given, then each turn as
# <|start_header_id|>{role}<|end_header_id|>\n\n{content | trim}<|eot_id|>
LLAMA32_CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- if not date_string is defined %}{%- if strftime_now is defined %}"
    "{%- set date_string = strftime_now('%d %b %Y') %}{%- else %}{%- set date_string = '26 Jul 2024' %}"
    "{%- endif %}{%- endif %}"
    "{%- if messages[0]['role'] == 'system' %}{%- set system_message = messages[0]['content'] | trim %}"
    "{%- set messages = messages[1:] %}{%- else %}{%- set system_message = '' %}{%- endif %}"
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}"
    "{{- 'Cutting Knowledge Date: December 2023\\n' }}{{- 'Today Date: ' + date_string + '\\n\\n' }}"
    "{{- system_message }}{{- '<|eot_id|>' }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim"
    " + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)


def save_llama32_instruct_tokenizer(folder: Path) -> Path:
    """:func:`save_llama3_tokenizer` with Llama-3.2-Instruct's chat template (Llasa's base)."""
    from transformers import AutoTokenizer

    save_llama3_tokenizer(folder)
    tok = AutoTokenizer.from_pretrained(str(folder))
    tok.chat_template = LLAMA32_CHAT_TEMPLATE
    tok.save_pretrained(str(folder))
    return folder
