"""Text to phonemes as a layout's upstream does it (``phonemize:`` in the layout), e.g. NeuTTS: the
``phonemizer`` package's eSpeak backend (``EspeakBackend(language, preserve_punctuation, with_stress)``), its
output's whitespace collapsed to single spaces (``" ".join(phones.split())``).

``phonemizer`` is an optional package (``pip install phonemizer``); it drives the eSpeak NG library voxrelay
already ships for the demo corpus (the ``espeakng-loader`` wheel), so no system package is needed.
"""

from __future__ import annotations

import functools
from typing import Any

from voxrelay.errors import UserError


class PhonemizerMissing(UserError, ImportError):
    """A layout phonemizes its text and the ``phonemizer`` package is not installed."""


@functools.lru_cache(maxsize=4)
def _backend(language: str, preserve_punctuation: bool, with_stress: bool) -> Any:
    try:
        from phonemizer.backend import EspeakBackend
        from phonemizer.backend.espeak.wrapper import EspeakWrapper
    except ImportError as err:
        raise PhonemizerMissing("this layout feeds the model eSpeak phonemes as its upstream does, through the "
                                "phonemizer package: pip install phonemizer") from err
    try:
        import espeakng_loader

        EspeakWrapper.set_library(espeakng_loader.get_library_path())
        EspeakWrapper.set_data_path(espeakng_loader.get_data_path())
    except ImportError:
        pass  # phonemizer finds a system libespeak-ng by itself
    return EspeakBackend(language=language, preserve_punctuation=preserve_punctuation, with_stress=with_stress)


@functools.lru_cache(maxsize=65536)
def phonemes(text: str, language: str, preserve_punctuation: bool, with_stress: bool) -> str:
    """``text`` as upstream's phonemizer call gives it, words separated by single spaces."""
    out = _backend(language, preserve_punctuation, with_stress).phonemize([text])
    return " ".join(out[0].split()) if out else ""
