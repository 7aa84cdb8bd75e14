"""What prepared data IS, as opposed to when it was written: the parameters that made it and a
content fingerprint that `train` compares on resume.

* ``codec_params``: what the codec's codes depend on (its description, without decode-only keys,
  plus what the built-in codec's fit depends on). Recorded in ``codec.json`` next to the fitted state.
* ``shard_params``: what a shard's rows depend on besides its ids (codec parameters + fitted state
  hash + the duration bounds). Recorded in each shard's ``.done`` marker.
* ``identity``: ids of the rows of every split, the codec state's sha256 and the parameters. Written
  into ``index.json``; a checkpoint stores it, and resume names what differs (:func:`describe_changes`).

Parameter dicts are flat with dotted config-like keys (``codec.hop_length``), so messages can name them.
"""

from __future__ import annotations

import hashlib
from typing import Any

from voxrelay.codecs.base import AudioCodec, FittableCodec
from voxrelay.config import RunConfig

CODEC_PARAMS_FILE = "codec.json"
# Keys of a codec description that change decoding only, never the codes in the shards.
DECODE_ONLY = frozenset({"griffin_lim_iters"})


def codec_params(cfg: RunConfig, codec: AudioCodec) -> dict[str, Any]:
    params = {f"codec.{k}": v for k, v in codec.describe().items() if k not in DECODE_ONLY}
    if isinstance(codec, FittableCodec):  # the fit samples clips with this seed, within these bounds
        params |= {"train.seed": cfg.train.seed, "data.min_duration": cfg.data.min_duration,
                   "data.max_duration": cfg.data.max_duration}
    return params


def shard_params(cfg: RunConfig, codec: AudioCodec, codec_sha: str | None,
                 required: tuple[str, ...] = ()) -> dict[str, Any]:
    """What the shards' content depends on. ``required``: the text fields the model family needs in every
    row (its data needs); recorded, with the default they get, only when there are any (the identity of
    data prepared for a family without such needs stays what it always was)."""
    params = codec_params(cfg, codec) | {"codec.state_sha256": codec_sha} | _data_params(cfg, required)
    if cfg.codec.batch_size > 1 and hasattr(codec, "encode_batch"):  # padding reaches the last frames' codes
        params["codec.batch_size"] = cfg.codec.batch_size
    return params


def _data_params(cfg: RunConfig, required: tuple[str, ...]) -> dict[str, Any]:
    params: dict[str, Any] = {"data.min_duration": cfg.data.min_duration, "data.max_duration": cfg.data.max_duration}
    if required:
        params["data.required_fields"] = list(required)
        params |= {f"data.default_{name}": getattr(cfg.data, f"default_{name}", None) for name in required}
    return params


def config_changes(cfg: RunConfig, committed: dict[str, Any]) -> list[str]:
    """What this config would change in prepared data made with the parameters ``committed`` (its identity's),
    told from the config alone, without the sources or a pretrained codec's weights: the duration bounds, the
    family's needs, and the codec (every setting of one built from the config, the type and path of a
    pretrained one and the keys it is loaded with, e.g. mimi's num_codebooks). ``codec.batch_size`` is not
    compared."""
    from voxrelay.codecs.registry import build_codec, from_path, pretrained_options

    needs = cfg.model.data_needs()
    new = _data_params(cfg, needs.fields)
    if needs.max_seconds is not None:
        new["data.max_seconds"] = needs.max_seconds
    if from_path(cfg.codec.type):
        new |= {"codec.type": cfg.codec.type, "codec.path": cfg.codec.path}
        new |= {f"codec.{k}": v for k, v in pretrained_options(cfg.codec).items()}
    else:
        new |= codec_params(cfg, build_codec(cfg.codec))
    return changed_keys({k: committed.get(k) for k in new}, new)


def changed_keys(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """``key old -> new`` for every key whose value differs."""
    return [f"{k} {old.get(k)!r} -> {new.get(k)!r}" for k in sorted(old.keys() | new.keys())
            if old.get(k) != new.get(k) and k != "codec.state_sha256"]


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def identity(shard_ids: dict[str, str], codec_sha: str | None, params: dict[str, Any]) -> dict[str, Any]:
    """``shard_ids``: shard name -> sha1 of its row ids (in plan order)."""
    rows: dict[str, str] = {}
    for split in ("train", "eval"):
        names = sorted(n for n in shard_ids if n.split("-")[0] == split)
        rows[split] = hashlib.sha1("\n".join(f"{n}:{shard_ids[n]}" for n in names).encode()).hexdigest()
    return {"rows": rows, "codec_sha256": codec_sha, "params": params}


def legacy_fingerprint(index: dict) -> str:
    """The fingerprint checkpoints stored before identities existed (without its timestamp part)."""
    return f"{index.get('counts')}|{len(index.get('shards', []))}"


def fingerprint(index: dict) -> dict | str:
    """What a checkpoint records about the prepared data it was trained on."""
    return index.get("identity") or legacy_fingerprint(index)


def describe_changes(saved: dict | str | None, index: dict) -> list[str]:
    """What differs between the data a checkpoint was trained on and the prepared data now; [] if same."""
    if saved is None:
        return []
    if isinstance(saved, str):  # a checkpoint from before identities: "created|counts|n_shards"
        return [] if saved.split("|", 1)[-1] == legacy_fingerprint(index) else ["the prepared rows or shards"]
    now = index.get("identity")
    if now is None:
        return ["the prepared data (prepared by an older voxrelay; re-run `voxrelay prepare`)"]
    out = [f"the rows of the {split} split (sources or data.eval_size/shard_size changed)"
           for split in ("train", "eval") if saved["rows"].get(split) != now["rows"].get(split)]
    out += changed_keys(saved["params"], now["params"])
    if saved.get("codec_sha256") != now.get("codec_sha256") and not any(k.startswith("codec.") for k in out):
        out.append("the fitted codec state (codec.safetensors was fitted again)")
    return out
