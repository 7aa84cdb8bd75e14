"""What the model family needs from ``prepare`` (:class:`voxrelay.models.base.DataNeeds`): the codec it
can take, the text fields every row must carry, its own check of a row, the longest audio it can learn from."""

from __future__ import annotations

from voxrelay.codecs.base import AudioCodec
from voxrelay.config import RunConfig
from voxrelay.data.shards import PrepareError
from voxrelay.data.types import Utterance
from voxrelay.models.base import DataNeeds


def missing_field(utt: Utterance, cfg: RunConfig, required: tuple[str, ...]) -> str | None:
    """Fill each required text field (``description``) the row lacks with its configured default; the
    reason to reject the row when a field has neither."""
    for name in required:
        if getattr(utt, name, None):
            continue
        default = getattr(cfg.data, f"default_{name}", None)
        if default is None:
            return (f"no {name} (model.family={cfg.model.family} needs one per row): give the source a {name} "
                    f"column or field, or set data.default_{name}")
        setattr(utt, name, default)
    return None


def check_codec_type(cfg: RunConfig) -> None:
    """Refuse, before any codec is built, a codec of a model family's own (``FamilySpec.codecs``) for a family that
    does not take it."""
    from voxrelay.codecs.registry import family_codecs

    needs = cfg.model.data_needs()
    if cfg.codec.type in family_codecs() and needs.features != cfg.codec.type:
        refusal = needs.refusal(cfg.model.family, {"type": cfg.codec.type, "codebook_size": 0},
                                where="configured codec")
        raise PrepareError(refusal or f"model.family={cfg.model.family} cannot learn from codec.type={cfg.codec.type}")


def family_needs(cfg: RunConfig, codec: AudioCodec) -> DataNeeds:
    """What ``model.family`` needs from prepare; a codec it cannot take is refused before anything is encoded."""
    needs = cfg.model.data_needs()
    refusal = needs.refusal(cfg.model.family, codec.describe(), where="configured codec")
    if refusal:
        raise PrepareError(refusal)
    if needs.codec is not None and cfg.codec.type != needs.codec:
        raise PrepareError(f"model.family={cfg.model.family} needs codes of the {needs.codec} codec, but codec.type="
                           f"{cfg.codec.type}; set codec.type={needs.codec} (and codec.path), under another data.name")
    if needs.codes is not None and (codec.num_codebooks, codec.codebook_size) != needs.codes:
        raise PrepareError(
            f"model.family={cfg.model.family} needs {needs.codes[0]} codes per frame of {needs.codes[1]} values, but "
            f"codec {cfg.codec.path or cfg.codec.type} gives {codec.num_codebooks} x {codec.codebook_size}; "
            "use the codec the family names (codec.path)")
    return needs
