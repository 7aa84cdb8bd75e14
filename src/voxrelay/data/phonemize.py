"""Text to IPA phonemes with eSpeak NG (the library the demo corpus speaks with), for models that
read phonemes instead of spelling (``model.tokenizer: phonemes``).

``phonemize("Did Felix carry it?", "en-us")`` -> ``"dˈɪd fˈiːlɪks kˈæɹi ɪt"``: eSpeak's own
pronunciation rules, stress marks included; clauses are joined with ", ". Deterministic and fast
(~1 ms per sentence). Needs the ``espeakng-loader`` wheel (a dependency) or an ``espeak-ng``
binary on PATH.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from functools import lru_cache

from voxrelay.data.demo_corpus import _INSTALL_HINT, _LIB_LOCK, SynthesisError, _EspeakLibrary

_CHARS_UTF8 = 1
_PHONEMES_IPA = 0x02


def _library_phonemes(inst: _EspeakLibrary, text: str, voice: str) -> str:
    lib = inst.lib
    lib.espeak_TextToPhonemes.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.c_int]
    lib.espeak_TextToPhonemes.restype = ctypes.c_char_p
    with _LIB_LOCK:
        inst._select_voice(voice)
        buf = ctypes.create_string_buffer(text.encode("utf-8"))
        ptr = ctypes.c_void_p(ctypes.addressof(buf))
        clauses = []
        while ptr.value:  # one clause per call; the pointer moves on (NULL at the end)
            out = lib.espeak_TextToPhonemes(ctypes.byref(ptr), _CHARS_UTF8, _PHONEMES_IPA)
            if out and out.strip():
                clauses.append(out.decode("utf-8").strip())
    return ", ".join(clauses)


def _binary_phonemes(text: str, voice: str) -> str:
    exe = shutil.which("espeak-ng") or shutil.which("espeak")
    if exe is None:
        raise SynthesisError(f"eSpeak NG is not available to phonemize text; {_INSTALL_HINT}")
    proc = subprocess.run([exe, "-q", "--ipa", "-v", voice, text], capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise SynthesisError(f"{exe} --ipa -v {voice} failed: {' '.join(proc.stderr.split())[:200]}")
    return ", ".join(line.strip() for line in proc.stdout.splitlines() if line.strip())


@lru_cache(maxsize=65536)
def phonemize(text: str, voice: str = "en-us") -> str:
    """IPA phonemes of ``text`` as eSpeak NG ``voice`` (a language tag such as en-us) says it."""
    try:
        inst = _EspeakLibrary.instance()
    except (ImportError, OSError, RuntimeError, AttributeError):
        return _binary_phonemes(text, voice)
    return _library_phonemes(inst, text, voice)
