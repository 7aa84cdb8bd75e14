"""Where a pretrained codec's ``codec.path`` leads: a local folder, a ``gs://`` / ``s3://`` folder (copied once
into the cache), or a hub id (``owner/name``, fetched into the HF cache), with the errors users meet on the way,
each naming the path and the fix, and the loader of a transformers model from it (``load_codec_model``). Shared by
the transformers-based codecs (DAC, XCodec2, NeuCodec, Mimi)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from voxrelay import storage
from voxrelay.codecs.base import CodecError, CodecNotFoundError, looks_local
from voxrelay.errors import one_line
from voxrelay.hf_weights import has_weights
from voxrelay.paths import cache_dir, uri_key

if TYPE_CHECKING:
    from transformers import PreTrainedModel


@dataclass(frozen=True)
class CodecSource:
    """How one kind of pretrained codec folder is named in errors."""

    label: str  # "DAC"
    saved_by: str  # what writes such a folder: "DacModel.save_pretrained"
    model_type: str  # config.json's model_type: "dac"
    example: str  # a hub id to suggest: "descript/dac_16khz"
    bucket_holds: str  # what a bucket folder must be: "a DAC or of a model with a DAC audio_encoder"

    def not_this_kind(self, where: str, problem: str) -> CodecNotFoundError:
        return CodecNotFoundError(
            f"{where!r} is not a {self.label} folder ({problem}); set codec.path to a folder written by "
            f"{self.saved_by} (model_type {self.model_type!r}), or set codec.type to the codec that folder holds"
        )


def resolve_folder(path: str, source: CodecSource) -> Path:
    """The local folder ``codec.path`` names: itself, a cached copy of a bucket folder, or a hub snapshot."""
    if "://" in path and not storage.is_local(path):
        return _from_bucket(path, source)
    local = Path(path).expanduser()
    if local.is_dir():
        return local
    if looks_local(path):
        raise CodecNotFoundError(
            f"{source.label} codec folder {path!r} does not exist; set codec.path to a local folder written by "
            f"{source.saved_by}, or to a hub id such as {source.example!r}"
        )
    return _hub_snapshot(path, source)


def _from_bucket(uri: str, source: CodecSource) -> Path:
    """A copy of the config and weights directly under ``uri`` (gs://, s3://; e.g. the Parler model folder an
    imported config names) in the cache ``model.init_from`` uses too, fetched once (same-size files are kept)."""
    local = cache_dir("init_from", uri_key(uri))
    sizes = {n: s for n, s in storage.file_sizes(uri).items() if n.endswith((".json", ".safetensors", ".bin"))}
    if "config.json" not in sizes:
        raise CodecNotFoundError(f"codec.path {uri!r} holds no config.json; give the folder of {source.bucket_holds}")
    for name, size in sizes.items():
        target = storage.checked_join(local, name, f"the listing of {uri}", single=True)
        if not (target.is_file() and target.stat().st_size == size):
            storage.get_file(storage.join(uri, name), target)
    return local


def _hub_snapshot(hub_id: str, source: CodecSource) -> Path:
    """The hub repo's config and weights (safetensors, else the pickle) in the local hub cache."""
    from huggingface_hub import snapshot_download

    try:
        folder = Path(snapshot_download(hub_id, allow_patterns=["*.json", "*.safetensors"]))
        return folder if has_weights(folder) else Path(snapshot_download(hub_id, allow_patterns=["*.json", "*.bin"]))
    except Exception as e:  # the hub client's errors have no common base worth naming
        raise CodecNotFoundError(
            f"could not load {source.label} codec {hub_id!r} as a hub id (it is not a local folder) "
            f"({one_line(e)[:200]}); set codec.path to a local folder written by {source.saved_by} (hub ids need "
            "network access or a warm HF cache)"
        ) from None


def read_config(folder: Path, source: CodecSource) -> dict[str, Any]:
    """config.json of a local folder; refused when absent (transformers would build a random model)."""
    try:
        config = json.loads((folder / "config.json").read_text())
    except FileNotFoundError:
        problem = "no config.json"
    except (json.JSONDecodeError, UnicodeDecodeError):
        problem = "config.json is not a JSON object"
    else:
        if isinstance(config, dict):
            return config
        problem = "config.json is not a JSON object"
    raise source.not_this_kind(str(folder), problem)


def load_codec_model(path: str, source: CodecSource, class_name: str,
                     optional: tuple[str, ...] = ()) -> PreTrainedModel:
    """The transformers model ``class_name`` in eval mode and float32 from a local folder, a gs:// / s3:// folder
    or a hub id; refused when config.json is another model's or a weight is missing (it would be random), except
    weights whose names end with one of ``optional`` (used in training only)."""
    import torch
    import transformers

    model_class = getattr(transformers, class_name, None)
    if model_class is None:
        raise CodecError(
            f"codec.type {source.model_type!r} needs transformers' {class_name}, which transformers "
            f"{transformers.__version__} lacks; upgrade it (`pip install -U transformers`) or choose another codec.type"
        )
    folder = resolve_folder(path, source)
    model_type = read_config(folder, source).get("model_type")
    if model_type != source.model_type:
        raise source.not_this_kind(path, f"config.json has model_type {model_type!r}")
    fix = f"set codec.path to an intact folder written by {source.saved_by}"
    try:  # float32 whatever the stored dtype: codes are roundings / nearest neighbours of the encoder's outputs
        model, info = model_class.from_pretrained(str(folder), dtype=torch.float32, output_loading_info=True)
    except OSError as e:
        raise CodecNotFoundError(f"could not load {source.label} codec {path!r} as a local folder ({one_line(e)}); "
                                 f"{fix}") from e
    except (RuntimeError, ValueError) as e:  # weights whose shapes disagree with config.json
        raise CodecError(f"the weights in {source.label} folder {path!r} do not fit its config.json "
                         f"({one_line(e)[:300]}); {fix}") from e
    missing = sorted(k for k in info.get("missing_keys", ()) if not k.endswith(optional))
    if missing:
        raise CodecError(f"the {source.label} folder {path!r} lacks weights {missing[:5]} (transformers would make "
                         f"them random); {fix}")
    return model.eval()
