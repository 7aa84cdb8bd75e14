"""Build codecs by name: from the run config (``build_codec``) or from a prepared dataset's
``index.json`` description (``codec_from_description``).

Implementations live in a dict keyed by ``codec.type``; the SDKs behind the pretrained codecs
(``snac``, ``transformers``: DAC, XCodec2, NeuCodec, Mimi) are imported only when such a codec is built.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from voxrelay.codecs.base import AudioCodec, CodecError, FittableCodec

if TYPE_CHECKING:
    from voxrelay.config import CodecConfig

# Parameters of MelKMeansCodec.__init__, all present in its describe() dict.
_MEL_KMEANS_PARAMS = (
    "sample_rate",
    "n_fft",
    "hop_length",
    "n_mels",
    "num_codebooks",
    "codebook_size",
    "fit_max_frames",
    "griffin_lim_iters",
)
# Fields of a pretrained codec's description that must still hold when it is loaded again:
# codes prepared with one model are meaningless to another.
_PRETRAINED_CHECKED = ("sample_rate", "frame_rate", "num_codebooks", "codebook_size")


def _import_sdk(module: str, package: str, kind: str) -> None:
    try:
        importlib.import_module(module)
    except ImportError as e:
        raise CodecError(
            f"codec.type '{kind}' needs the {package!r} package, which failed to import ({e}); "
            f"install it with `pip install {package}` or choose another codec.type"
        ) from e


def _mel_kmeans(params: dict[str, Any]) -> AudioCodec:
    from voxrelay.codecs.mel_kmeans import MelKMeansCodec

    return MelKMeansCodec(**params)


def _snac(path: str) -> AudioCodec:
    _import_sdk("snac", "snac", "snac")
    from voxrelay.codecs.snac import SnacCodec

    return SnacCodec.from_pretrained(path)


def _dac(path: str) -> AudioCodec:
    _import_sdk("transformers", "transformers", "dac")
    from voxrelay.codecs.dac import DacCodec

    return DacCodec.from_pretrained(path)


def _xcodec2(path: str) -> AudioCodec:
    _import_sdk("transformers", "transformers", "xcodec2")
    from voxrelay.codecs.xcodec2 import Xcodec2Codec

    return Xcodec2Codec.from_pretrained(path)


def _neucodec(path: str) -> AudioCodec:
    _import_sdk("transformers", "transformers", "neucodec")
    from voxrelay.codecs.neucodec import NeuCodecCodec

    return NeuCodecCodec.from_pretrained(path)


def _mimi(path: str, num_codebooks: int) -> AudioCodec:
    _import_sdk("transformers", "transformers", "mimi")
    from voxrelay.codecs.mimi import MimiCodec

    return MimiCodec.from_pretrained(path, num_codebooks)


def family_codecs() -> dict[str, str]:
    """codec.type -> "module:Class" of the codecs model families bring (``FamilySpec.codecs``)."""
    from voxrelay.models.registry import FAMILIES

    return {kind: ref for spec in FAMILIES.values() for kind, ref in spec.codecs.items()}


def _family_codec(kind: str) -> Any:
    module, attr = family_codecs()[kind].split(":")
    return getattr(importlib.import_module(module), attr)


def _pcm(sample_rate: int) -> AudioCodec:
    from voxrelay.codecs.pcm import PcmCodec

    return PcmCodec(sample_rate)


# codec.type -> loader of a pretrained codec from a local folder or hub id (and its PRETRAINED_KEYS).
PRETRAINED_CODECS: dict[str, Callable[..., AudioCodec]] = {
    "snac": _snac, "dac": _dac, "xcodec2": _xcodec2, "neucodec": _neucodec, "mimi": _mimi,
}
# codec.type -> the codec.* keys besides codec.path a pretrained codec is loaded with (keyword arguments of its
# loader); they change the codes, so describe() records them and a description reloads with them.
PRETRAINED_KEYS: dict[str, tuple[str, ...]] = {"mimi": ("num_codebooks",)}
# codec.type -> the released model's hub id (what an error suggests for codec.path).
HUB_EXAMPLES = {"snac": "hubertsiuzdak/snac_24khz", "dac": "descript/dac_16khz", "xcodec2": "HKUSTAudio/xcodec2-hf",
                "neucodec": "neuphonic/neucodec", "mimi": "kyutai/mimi"}
# codec.type -> builder of a codec made from ``codec.sample_rate`` alone (nothing fitted, nothing downloaded).
PLAIN_CODECS: dict[str, Callable[[int], AudioCodec]] = {"pcm": _pcm}
# codec.type -> builder of a codec fitted on the corpus, from its parameters.
FITTABLE_CODECS: dict[str, Callable[[dict[str, Any]], AudioCodec]] = {"mel_kmeans": _mel_kmeans}


def codec_types() -> list[str]:
    """Every known ``codec.type``."""
    return sorted([*FITTABLE_CODECS, *PRETRAINED_CODECS, *PLAIN_CODECS, *family_codecs()])


def from_path(kind: str) -> bool:
    """Whether a codec of ``kind`` is loaded from ``codec.path`` (pretrained, or a family's own)."""
    return kind in PRETRAINED_CODECS or kind in family_codecs()


def pretrained_options(cfg: CodecConfig) -> dict[str, Any]:
    """The PRETRAINED_KEYS of ``cfg.type`` with their values ({} for a codec loaded from codec.path alone)."""
    return {k: getattr(cfg, k) for k in PRETRAINED_KEYS.get(cfg.type, ())}


def _unknown(kind: Any) -> CodecError:
    return CodecError(f"unknown codec type {kind!r}; set codec.type to one of {codec_types()}")


def build_codec(cfg: CodecConfig) -> AudioCodec:
    """The codec a run config asks for. mel_kmeans comes back unfitted (``prepare`` fits it)."""
    if cfg.type in PLAIN_CODECS:
        return PLAIN_CODECS[cfg.type](cfg.sample_rate)
    if cfg.type in FITTABLE_CODECS:
        return FITTABLE_CODECS[cfg.type]({k: getattr(cfg, k) for k in _MEL_KMEANS_PARAMS})
    if from_path(cfg.type):
        if not cfg.path:
            what = (getattr(_family_codec(cfg.type), "path_hint", "the model whose parts make it")
                    if cfg.type in family_codecs() else "a local folder or hub id of the pretrained codec (e.g. "
                    f"codec.path={HUB_EXAMPLES[cfg.type]})")
            raise CodecError(f"codec.type '{cfg.type}' needs codec.path: {what}")
        if cfg.type in PRETRAINED_CODECS:
            return PRETRAINED_CODECS[cfg.type](cfg.path, **pretrained_options(cfg))
        _import_sdk("transformers", "transformers", cfg.type)
        return _family_codec(cfg.type).load(cfg.path)
    raise _unknown(cfg.type)


def codec_from_description(desc: dict[str, Any], state: bytes | None = None) -> AudioCodec:
    """Rebuild the codec described by ``codec.describe()`` (as stored in a prepared ``index.json``).

    ``state``: the fitted state bytes of a fittable codec (``state_bytes()``); without it a
    fittable codec comes back unfitted. Pretrained codecs are reloaded from ``desc["path"]`` and
    checked against the description.
    """
    kind = desc.get("type")
    if kind in family_codecs():  # loads what it needs only when it encodes or decodes
        return _family_codec(kind).from_description(desc)
    if kind in PLAIN_CODECS:
        return PLAIN_CODECS[kind](int(desc["sample_rate"]))
    if kind in FITTABLE_CODECS:
        missing = [k for k in _MEL_KMEANS_PARAMS if k not in desc]
        if missing:
            raise CodecError(f"codec description {desc} lacks {missing}; it was not written by describe()")
        codec = FITTABLE_CODECS[kind]({k: desc[k] for k in _MEL_KMEANS_PARAMS})
        if state is not None:
            assert isinstance(codec, FittableCodec)
            codec.load_state_bytes(state)
        return codec
    if kind in PRETRAINED_CODECS:
        if state is not None:
            raise CodecError(f"codec type {kind!r} is pretrained and takes no fitted state; pass state=None")
        if not desc.get("path"):
            raise CodecError(
                f"codec description {desc} has no path (the codec was wrapped from an in-memory model); "
                "load that model yourself and wrap it with from_model(), or prepare with codec.path set"
            )
        missing = [k for k in PRETRAINED_KEYS.get(kind, ()) if k not in desc]
        if missing:
            raise CodecError(f"codec description {desc} lacks {missing}; it was not written by describe()")
        try:
            codec = PRETRAINED_CODECS[kind](desc["path"], **{k: desc[k] for k in PRETRAINED_KEYS.get(kind, ())})
        except CodecError as e:
            raise type(e)(
                f"the codec the data was prepared with (codec.path={desc['path']!r}, recorded in the prepared "
                f"index.json) cannot be loaded any more: {e}; restore that codec or prepare the data again"
            ) from e
        _check_same(desc, codec.describe())
        return codec
    raise _unknown(kind)


def _check_same(saved: dict[str, Any], loaded: dict[str, Any]) -> None:
    diff = {k: (saved[k], loaded[k]) for k in _PRETRAINED_CHECKED if k in saved and saved[k] != loaded[k]}
    if diff:
        raise CodecError(
            f"codec at {saved['path']!r} no longer matches the one the data was prepared with "
            f"(field: (prepared, now) = {diff}); restore that codec or prepare the data again"
        )
