"""Upstream f5-tts 1.1.22's text tokens and ids for voxrelay's re-implementation (tests/unit/models/test_f5_dit.py).

Run it once in the environment of scripts/f5_reference.py:

    /tmp/f5/bin/python scripts/f5_text_reference.py [OUT_DIR]       # default: tests/fixtures/f5

Writes OUT_DIR/vocab.txt (the pinyin vocabulary F5TTS_v1_Base was trained with, as f5-tts ships it) and
text_reference.json: for each text, ``convert_char_to_pinyin`` 's tokens and ``list_str_to_idx`` 's ids with that
vocabulary, and the UTF-8 ids of the "byte" tokenizer.
"""

from __future__ import annotations

import json
import shutil
import sys
from importlib.resources import files
from pathlib import Path

from f5_tts.model.utils import convert_char_to_pinyin, get_tokenizer, list_str_to_idx, list_str_to_tensor

OUT = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "f5"
OUT.mkdir(parents=True, exist_ok=True)
vocab_file = str(files("f5_tts").joinpath("infer/examples/vocab.txt"))
shutil.copy(vocab_file, OUT / "vocab.txt")
vocab, size = get_tokenizer(vocab_file, "custom")
TEXTS = ["Hello world!", "你好，世界。", "I said 你好 to F5-TTS; ok", "Dr. Smith's 3rd-floor office, “really”?",
         "日本語のテキストです", "Ünïcödé café ☺ naïve", "don't  stop:now", "混合mixed文本123测试"]
cases = []
for text in TEXTS:
    toks = convert_char_to_pinyin([text])[0]
    cases.append({"text": text, "tokens": toks, "ids": list_str_to_idx([toks], vocab)[0].tolist(),
                  "bytes": list_str_to_tensor([text])[0].tolist()})
(OUT / "text_reference.json").write_text(json.dumps({"vocab_size": size, "cases": cases}, ensure_ascii=False,
                                                    indent=1))
print(size, cases[2])
