"""``voxrelay import parler-config FILE.json -o parler.yaml``: an upstream parler-tts training JSON (the
arguments of ``training/run_parler_tts_training.py``) as a voxrelay config. Every field it can map is mapped;
the others are listed with the reason they are dropped; unknown fields are listed as such.

Paths under a gcsfuse mount (``/mnt/gs/<bucket>/...``, ``/gcs/<bucket>/...``) become ``gs://<bucket>/...``:
voxrelay talks to the bucket itself, and ``output_dir`` becomes ``root`` + the run's ``name``.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from voxrelay import storage
from voxrelay.errors import UserError

FRAME_RATE = 86  # Parler's DAC frames per second: a batch of N utterances of D seconds is ~N x D x 86 tokens
MOUNTS = re.compile(r"^/(?:mnt/gs|mnt/gcs|gcs|mnt/disks/gcs)/([^/]+)(/.*)?$")

DROPPED = {  # field -> why voxrelay does not need it
    "cache_dir": "voxrelay keeps hub downloads in the bucket itself (cache.models_uri, default {root}/hf-cache: "
                 "later sessions copy them from there), and a local copy in $VOXRELAY_CACHE/hf-hub",
    "temporary_save_to_disk": "prepare writes its shards straight to <root>/prepared/<data.name>",
    "overwrite_output_dir": "a run folder is resumed by default; `voxrelay train --fresh` starts over",
    "eval_dataset_name": "voxrelay holds out data.eval_size rows of the training sources",
    "eval_metadata_dataset_name": "voxrelay holds out data.eval_size rows of the training sources",
    "eval_dataset_config_name": "voxrelay holds out data.eval_size rows of the training sources",
    "eval_split_name": "voxrelay holds out data.eval_size rows of the training sources",
    "group_by_length": "voxrelay always batches by length (duration-bucketed batch plan)",
    "add_audio_samples_to_wandb": "eval samples always go to TensorBoard (and wandb with monitor.wandb)",
    "preprocessing_num_workers": "prepare splits the work across the processes of `torchrun ... voxrelay prepare`",
    "do_train": "`voxrelay train` trains", "do_eval": "evals run every train.eval_every steps",
    "predict_with_generate": "every eval generates speech", "include_for_metrics": "every eval reports its metrics",
    "evaluation_strategy": "evals run every train.eval_every steps",
    "eval_strategy": "evals run every train.eval_every steps",
    "per_device_eval_batch_size": "eval speaks train.eval_synth texts one by one",
    "dataloader_num_workers": "voxrelay reads prepared shards from its local cache",
    "attn_implementation": "voxrelay's Parler uses torch SDPA",
    "feature_extractor_name": "upstream takes only the sampling rate and padding from it; its codes come from the "
                              "model's own DAC (model_name_or_path's audio_encoder), which is codec.path",
}
# the voxrelay keys this importer fills, and the upstream fields (with upstream's default) that fill them: a key the
# file leaves unfilled is named with voxrelay's default
FILLS = {"train.lr": ("learning_rate", 5e-5), "train.weight_decay": ("weight_decay", 0.0),
         "train.warmup_steps": ("warmup_steps", 0), "train.grad_accum": ("gradient_accumulation_steps", 1),
         "train.log_every": ("logging_steps", 500), "train.eval_every": ("eval_steps", None),
         "train.seed": ("seed", 42), "train.betas": ("adam_beta1/adam_beta2", (0.9, 0.999)),
         "train.eps": ("adam_epsilon", 1e-8), "train.clip_norm": ("max_grad_norm", 1.0),
         "train.schedule": ("lr_scheduler_type", "linear"), "train.precision": ("dtype", "float32"),
         "train.batch_tokens": ("per_device_train_batch_size", 8), "train.gradient_checkpointing":
         ("gradient_checkpointing", False), "model.init_from": ("model_name_or_path", None),
         "data.name": ("save_to_disk", None), "data.eval_size": ("max_eval_samples", None),
         "checkpoint.every_steps": ("save_steps", 500)}
UNMAPPED_OK = {"wandb_project", "wandb_run_name", "output_dir", "model_name_or_path", "resume_from_checkpoint",
               "report_to", "num_train_epochs", "save_to_disk"}
TOKENS_PER_ROW = 9 + 40  # the delay pattern's K columns and a transcript, beside 86 frames per second of audio


class ImportError_(UserError, ValueError):
    """The upstream file cannot be read as a parler-tts training JSON."""


def bucket_path(path: str) -> str:
    """``/mnt/gs/<bucket>/x`` -> ``gs://<bucket>/x``; other paths unchanged."""
    m = MOUNTS.match(path.rstrip("/"))
    return f"gs://{m.group(1)}{m.group(2) or ''}" if m else path.rstrip("/")


def _split(value: Any) -> list[str]:
    return [v.strip() for v in str(value).split("+")] if value else []


def _sources(args: dict) -> list[dict]:
    """One hf source per ``+``-joined dataset (its config, split and metadata dataset at the same place)."""
    names = _split(args.get("train_dataset_name"))
    configs, splits = _split(args.get("train_dataset_config_name")), _split(args.get("train_split_name"))
    metas = _split(args.get("train_metadata_dataset_name"))
    sources = []
    for i, name in enumerate(names):
        src = {"type": "hf", "hub_id": name, "split": splits[i] if i < len(splits) else "train"}
        if i < len(configs) and configs[i]:
            src["hub_config"] = configs[i]
        if i < len(metas) and metas[i]:
            src["metadata_hub_id"] = metas[i]
        for field, key in (("target_audio_column_name", "audio_column"), ("prompt_column_name", "text_column"),
                           ("description_column_name", "description_column"), ("id_column_name", "id_column")):
            if args.get(field):
                src[key] = args[field]
        sources.append(src)
    return sources


def _train(args: dict, notes: list[str]) -> dict:
    train: dict[str, Any] = {}
    simple = {"learning_rate": "lr", "weight_decay": "weight_decay", "warmup_steps": "warmup_steps",
              "gradient_accumulation_steps": "grad_accum", "gradient_checkpointing": "gradient_checkpointing",
              "logging_steps": "log_every", "eval_steps": "eval_every", "seed": "seed", "adam_epsilon": "eps",
              "max_grad_norm": "clip_norm"}
    if int(args.get("max_steps") or -1) > 0:  # upstream: max_steps > 0 overrides num_train_epochs
        train["max_steps"] = int(args["max_steps"])
    train |= {key: args[field] for field, key in simple.items() if args.get(field) is not None}
    if "adam_beta1" in args or "adam_beta2" in args:
        train["betas"] = [args.get("adam_beta1", 0.9), args.get("adam_beta2", 0.999)]
    if args.get("lr_scheduler_type"):
        train["schedule"] = args["lr_scheduler_type"]
    if args.get("dtype") in ("bfloat16", "float16"):
        train["precision"] = "bf16" if args["dtype"] == "bfloat16" else "fp16"
    if args.get("per_device_train_batch_size"):
        n, seconds = int(args["per_device_train_batch_size"]), float(args.get("max_duration_in_seconds") or 30)
        train["batch_tokens"] = int(n * (seconds * FRAME_RATE + TOKENS_PER_ROW))
        notes.append(f"per_device_train_batch_size={n} -> train.batch_tokens={train['batch_tokens']} (voxrelay "
                     f"batches by tokens: {n} x {seconds:g} s x {FRAME_RATE} frames/s + the delay pattern and "
                     "a transcript)")
    return train


def convert(args: dict, prepared: dict | None = None, prepared_uri: str | None = None) -> tuple[dict, list[str]]:
    """(voxrelay config dict, notes: every field dropped or approximated, and why; unknown fields; keys left at
    voxrelay's defaults). ``prepared``: the index.json of the run's prepared data, to turn epochs into steps."""
    notes: list[str] = []
    out_dir = bucket_path(str(args.get("output_dir") or "./output_dir_training"))
    root, _, name = out_dir.rpartition("/")
    config: dict[str, Any] = {"name": re.sub(r"[^A-Za-z0-9_.-]", "-", name) or "parler", "root": root or "."}
    init = args.get("resume_from_checkpoint") or args.get("model_name_or_path")
    if args.get("resume_from_checkpoint"):
        notes.append("resume_from_checkpoint -> model.init_from: its weights are loaded (an upstream checkpoint-* "
                     "folder); voxrelay then resumes its own run by itself")
    model: dict[str, Any] = {"family": "parler"}
    if init:
        model["init_from"] = bucket_path(str(init))
    for field, key in (("description_tokenizer_name", "description_tokenizer"),
                       ("prompt_tokenizer_name", "prompt_tokenizer"), ("freeze_text_encoder", "freeze_text_encoder"),
                       ("max_text_length", "max_prompt_tokens")):
        if args.get(field) is not None:
            model[key] = args[field]
    data: dict[str, Any] = {"sources": _sources(args)}
    if args.get("save_to_disk"):  # upstream's encoded dataset: voxrelay's prepared data, by the same name
        data["name"] = re.sub(r"[^A-Za-z0-9_.-]", "-", bucket_path(str(args["save_to_disk"])).rsplit("/", 1)[-1])
    for field, key in (("min_duration_in_seconds", "min_duration"), ("max_duration_in_seconds", "max_duration"),
                       ("max_eval_samples", "eval_size")):
        if args.get(field) is not None:
            data[key] = args[field]
    # upstream encodes with model.audio_encoder: the DAC inside model_name_or_path (parler-tts/dac_44khZ_8kbps's
    # weights for every released model), whatever feature_extractor_name says
    source = args.get("model_name_or_path")
    codec = {"type": "dac", "path": bucket_path(str(source)) if source else "parler-tts/dac_44khZ_8kbps"}
    if args.get("audio_encoder_per_device_batch_size"):
        codec["batch_size"] = int(args["audio_encoder_per_device_batch_size"])
    config |= {"data": data, "codec": codec, "model": model, "train": _train(args, notes)}
    if args.get("save_steps"):
        config["checkpoint"] = {"every_steps": args["save_steps"]} | (
            {"keep_last": max(2, int(args["save_total_limit"]))} if args.get("save_total_limit") else {})
    _epochs(args, config, prepared, prepared_uri, notes)
    reports = args.get("report_to") or []
    reports = [reports] if isinstance(reports, str) else reports
    if "wandb" in reports:
        config["monitor"] = {"wandb": True}
    notes += [f"report_to {r}: dropped (TensorBoard and metrics.jsonl are always written)" for r in reports
              if r != "wandb"]
    known = set(DROPPED) | UNMAPPED_OK | _mapped_fields()
    notes += [f"{field}: dropped ({DROPPED[field]})" for field in args if field in DROPPED]
    notes += [f"{field}: unknown to this importer, left out (check it by hand)" for field in args if field not in known]
    return config, notes + _defaulted(config)


def _epochs(args: dict, config: dict, prepared: dict | None, prepared_uri: str | None, notes: list[str]) -> None:
    """num_train_epochs -> train.max_steps: epochs x the prepared training split's tokens / tokens per step (upstream
    counts rows per batch; voxrelay batches by tokens), for one GPU; without the prepared data, what to set."""
    epochs, train = float(args.get("num_train_epochs", 3.0)), config["train"]  # 3.0: TrainingArguments' default
    if "max_steps" in train:
        return
    tokens_per_step = int(train.get("batch_tokens") or 0) * int(train.get("grad_accum") or 1)
    if prepared is not None and tokens_per_step:
        shards = [s for s in prepared.get("shards", []) if s.get("split") == "train"]
        rows, seconds = sum(int(s["rows"]) for s in shards), sum(float(s["seconds"]) for s in shards)
        per_epoch = max(1, math.ceil((seconds * FRAME_RATE + rows * TOKENS_PER_ROW) / tokens_per_step))
        train["max_steps"] = int(math.ceil(float(epochs))) * per_epoch
        notes.append(f"num_train_epochs={epochs:g} -> train.max_steps={train['max_steps']} ({per_epoch} steps an "
                     f"epoch: {rows} training rows, {seconds / 3600:.1f} h in {prepared_uri}, at "
                     f"{tokens_per_step} tokens a step on one GPU; divide by the number of GPUs)")
        return
    uri = prepared_uri or storage.join(config["root"], "prepared", config["data"].get("name", "demo"))
    notes.append(f"num_train_epochs={epochs:g}: train.max_steps left at 300; set it to {epochs:g} x the prepared "
                 "training data's tokens / (train.batch_tokens x train.grad_accum x GPUs), or prepare the data "
                 f"(`voxrelay prepare` this config) and import this file again with --prepared {uri}")


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _defaulted(config: dict) -> list[str]:
    """A note per key of :data:`FILLS` the import left unset: voxrelay's default stays (named with upstream's)."""
    from voxrelay.config import build_config

    defaults = build_config({"model": {"family": "parler"}})
    notes = []
    for key, (field, upstream) in FILLS.items():
        section, name = key.split(".")
        if name in config.get(section, {}):
            continue
        ours = _plain(getattr(getattr(defaults, section), name))
        theirs = "" if upstream is None else f"; upstream's default is {_plain(upstream)!r}"
        notes.append(f"{key}: left at voxrelay's default {ours!r} ({field} is not in the file{theirs})")
    return notes


def _mapped_fields() -> set[str]:
    return {"train_dataset_name", "train_dataset_config_name", "train_split_name", "train_metadata_dataset_name",
            "target_audio_column_name", "prompt_column_name", "description_column_name", "id_column_name",
            "learning_rate", "weight_decay", "warmup_steps", "gradient_accumulation_steps", "gradient_checkpointing",
            "logging_steps", "eval_steps", "seed", "max_steps", "adam_beta1", "adam_beta2", "lr_scheduler_type",
            "dtype", "per_device_train_batch_size", "description_tokenizer_name", "prompt_tokenizer_name",
            "freeze_text_encoder", "max_text_length", "min_duration_in_seconds", "max_duration_in_seconds",
            "max_eval_samples", "save_steps", "save_total_limit", "audio_encoder_per_device_batch_size",
            "adam_epsilon", "max_grad_norm"}


def import_config(path: Path, prepared: str | None = None) -> tuple[str, list[str]]:
    """(the YAML text, the notes) of the upstream training JSON at ``path``; the YAML validates as a config.
    ``prepared``: a prepared dataset (default: the converted config's own, when its root is local) whose size turns
    ``num_train_epochs`` into ``train.max_steps``."""
    import yaml

    from voxrelay.config import build_config

    try:
        args = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ImportError_(f"{path}: cannot read it as JSON ({e}); pass upstream's training JSON "
                           "(helpers/training_configs/*.json)") from None
    if not isinstance(args, dict) or "train_dataset_name" not in args:
        raise ImportError_(f"{path}: not a parler-tts training JSON (no train_dataset_name)")
    config, _ = convert(args)
    uri = prepared or storage.join(config["root"], "prepared", config["data"].get("name", "demo"))
    index = _index(uri, explicit=prepared is not None)
    config, notes = convert(args, index, uri if index is not None else prepared)
    build_config(config, str(path))  # what it wrote must be a valid config (raises, naming the key)
    header = f"# imported from {path} by `voxrelay import parler-config`; review the notes it printed\n"
    return header + yaml.safe_dump(config, sort_keys=False), notes


def _index(uri: str, explicit: bool) -> dict | None:
    """index.json of the prepared data at ``uri``; looked for unasked only on a local root (a bucket costs a
    round trip, or minutes without network); asked and absent: refused."""
    if not explicit and not storage.is_local(uri):
        return None
    index = storage.join(uri, "index.json")
    if storage.exists(index):
        return storage.read_json(index)
    if explicit:
        raise ImportError_(f"--prepared {uri}: no index.json there; pass <root>/prepared/<data.name> of data that "
                           "`voxrelay prepare` finished")
    return None
