"""The run configuration's sections and how a config is loaded, validated and compared on resume (read through
:mod:`voxrelay.config`)."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from voxrelay.config.fields import Section
from voxrelay.config.source import apply_overrides, read_config_text  # noqa: F401 (apply_overrides: public here)
from voxrelay.cost.config import CostConfig
from voxrelay.errors import ConfigError, UserError, one_line  # noqa: F401 (ConfigError: public here)
from voxrelay.models.lora_config import LoraConfig
from voxrelay.models.registry import DEFAULT_FAMILY, FAMILIES, unknown_family
from voxrelay.quality.config import EvalConfig
from voxrelay.train.config import TrainConfig, parse_duration

_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def _check_name(v: str, what: str) -> str:
    if not _NAME_RE.fullmatch(v):
        raise ValueError(f"{v!r} is not a usable {what}; use letters, digits, '.', '_' or '-' (no '/', no '..')")
    return v


class SourceConfig(Section):
    """One input of ``prepare``."""

    type: Literal["folder", "ljspeech", "jsonl", "hf", "demo"] = Field(
        description="folder: metadata.csv + wav/txt; ljspeech: metadata.csv with '|' + wavs/; "
        "jsonl: one JSON object per line (audio, text, optional speaker, description); "
        "hf: a HF datasets dataset with an Audio column; demo: a generated eSpeak NG corpus"
    )
    path: str | None = Field(
        None, description="Folder (folder, ljspeech), .jsonl file (jsonl), or save_to_disk folder (hf): a local "
        "path or a gs:// / s3:// URI"
    )
    hub_id: str | None = Field(None, description="hf only: a hub dataset id, used when `path` is not set")
    hub_config: str | None = Field(None, description="hf only: dataset config name")
    split: str = Field("train", description="hf only: split to read")
    audio_column: str = Field("audio", description="hf/jsonl: column holding the audio")
    text_column: str = Field("text", description="hf/jsonl: column holding the transcript")
    speaker_column: str | None = Field("speaker", description="hf/jsonl: column holding the speaker name")
    description_column: str | None = Field("description", description="hf/jsonl: column with a description")
    voice_prompts_column: str | None = Field(
        "voice_prompts", description="hf/jsonl: column with a row's voice prompts, one clip per speaker in the order "
        "of its labels (a path or a list of paths, as community fine-tuning datasets write them); folder "
        "sources read a `voice_prompts` column of paths separated by `;`",
    )
    conversation_column: str | None = Field(
        "conversation", description="hf/jsonl: column naming the conversation a row is a turn of (folder sources: a "
        "`conversation` column), for a family that takes the previous turns as context",
    )
    turn_column: str | None = Field(
        "turn", description="hf/jsonl: column with the row's place in its conversation, a whole number (folder "
        "sources: a `turn` column); rows without one are ordered by id",
    )
    minutes: float = Field(20.0, gt=0, description="demo only: minutes of audio to generate")
    voices: list[str] = Field(
        default_factory=lambda: ["en-us", "en-gb+f3", "en-us+m3", "en-gb-scotland+f2"],
        description="demo only: eSpeak NG voices (voice+variant), one speaker each",
    )
    seed: int = Field(0, description="demo only: seed of the sentence generator")
    layout: Literal["sentences", "dialogues"] = Field(
        "sentences", description="demo only: sentences: one sentence per row; dialogues: two-voice dialogues with "
        "[SPEAKER_A]/[SPEAKER_B] transcripts and one-voice segments, in a metadata.csv + audio/ + text/ folder",
    )
    metadata_path: str | None = Field(
        None, description="hf only: a load_from_disk folder of a metadata dataset joined on id_column (e.g. "
        "Parler's *_tagged_10k_generated descriptions); its description_column gives each row's description",
    )
    metadata_hub_id: str | None = Field(None, description="hf only: a hub metadata dataset, when metadata_path is "
                                        "not set (e.g. a *_tagged_10k_generated descriptions set)")
    metadata_config: str | None = Field(None, description="hf only: config of the metadata dataset (None = hub_config)")
    metadata_split: str | None = Field(None, description="hf only: split of the metadata dataset (None = split)")
    id_column: str = Field("id", description="hf only: the column that identifies a row (and joins the metadata)")

    @model_validator(mode="after")
    def _needs_location(self) -> SourceConfig:
        if self.type in ("folder", "ljspeech", "jsonl") and not self.path:
            raise ValueError(f"source type '{self.type}' needs `path` (a folder or file: local, gs:// or s3://)")
        if self.type == "hf" and not (self.path or self.hub_id):
            raise ValueError("source type 'hf' needs `path` (a load_from_disk folder) or `hub_id`")
        return self


class DataConfig(Section):
    name: str = Field("demo", description="Prepared data lives at <root>/prepared/<name>/")
    sources: list[SourceConfig] = Field(
        default_factory=lambda: [SourceConfig(type="demo")], description="Inputs of prepare"
    )
    min_duration: float = Field(0.3, ge=0, description="Seconds; shorter clips are rejected")
    max_duration: float = Field(20.0, gt=0, description="Seconds; longer clips are rejected")
    eval_size: int = Field(24, ge=0, description="Number of utterances held out for evaluation")
    shard_size: int = Field(256, gt=0, description="Utterances per Parquet shard")
    max_reject_fraction: float = Field(
        0.25, ge=0, le=1, description="prepare stops, naming the most common reasons, when more than this share of "
        "the rows is rejected (a shared cause: a column, a path, a transcript format, a duration bound), instead "
        "of committing the rest for `train`; 1: any share. A prepare that keeps no training row always stops",
    )
    default_description: str | None = Field(
        None, description="Description given to rows without one, for a family that needs one per row (e.g. "
        "Parler-TTS); None: such rows are rejected, naming the row",
    )

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return _check_name(v, "data name")

    @model_validator(mode="after")
    def _durations(self) -> DataConfig:
        if self.min_duration >= self.max_duration:
            raise ValueError(
                f"min_duration ({self.min_duration}) must be below max_duration ({self.max_duration})"
            )
        return self


# codec.type: the built-in ones, then those model families bring (FamilySpec.codecs)
FAMILY_CODECS = tuple(sorted({kind for spec in FAMILIES.values() for kind in spec.codecs}))
CODEC_TYPES = ("mel_kmeans", "snac", "dac", "xcodec2", "neucodec", "mimi", "pcm", *FAMILY_CODECS)
# Defaults that depend on codec.type (a key the config sets wins): Mimi keeps CSM's 32 codebooks.
CODEC_TYPE_DEFAULTS: dict[str, dict[str, Any]] = {"mimi": {"num_codebooks": 32}}


class CodecConfig(Section):
    type: Literal[CODEC_TYPES] = Field(  # type: ignore[valid-type]
        "mel_kmeans", description="mel_kmeans: built-in, no download; snac / dac / xcodec2 / neucodec / mimi: "
        "pretrained neural codecs (xcodec2: Llasa's, 16 kHz; neucodec: NeuTTS', 24 kHz out, encodes at 16 kHz; "
        "mimi: Kyutai's, CSM's and Moshi's, 24 kHz, 12.5 frames/s); pcm: "
        "the audio itself (16-bit, at codec.sample_rate), for a family that learns from continuous features"
        + (f"; {' / '.join(FAMILY_CODECS)}: a model family's own (docs/models.md, that family's section)"
           if FAMILY_CODECS else "")
    )
    path: str | None = Field(None, description="snac/dac/xcodec2/neucodec/mimi: local folder or hub id of the "
                             "pretrained codec; a family's own codec: the model (folder or hub id) whose parts make it")
    batch_size: int = Field(
        1, gt=0, description="dac: clips encoded together by prepare, on the GPU when there is one (upstream "
        "Parler: 8-24); >1 is much faster on a GPU, and the last frames of a shorter clip then see the batch's "
        "padding instead of its own end (upstream does the same); 1: each clip alone",
    )
    sample_rate: int = Field(16000, gt=0, description="mel_kmeans / pcm: sample rate (Hz)")
    n_fft: int = Field(1024, gt=0, description="mel_kmeans: FFT size")
    hop_length: int = Field(256, gt=0, description="mel_kmeans: hop in samples (frame rate = sr / hop)")
    n_mels: int = Field(80, gt=0, description="mel_kmeans: mel bands")
    num_codebooks: int = Field(4, gt=0, description="mel_kmeans: residual k-means stages; mimi: the first N of its "
                               "quantizers kept (default 32 with codec.type mimi, as CSM; Moshi: 8)")
    codebook_size: int = Field(256, gt=1, description="mel_kmeans: centroids per stage")
    fit_max_frames: int = Field(200_000, gt=0, description="mel_kmeans: frames sampled to fit k-means")
    griffin_lim_iters: int = Field(32, gt=0, description="mel_kmeans: Griffin-Lim iterations when decoding")

    @model_validator(mode="before")
    @classmethod
    def _type_defaults(cls, data: Any) -> Any:
        """The CODEC_TYPE_DEFAULTS of the config's codec.type under the keys it leaves out."""
        if isinstance(data, dict) and data.get("type") in CODEC_TYPE_DEFAULTS:
            return {**CODEC_TYPE_DEFAULTS[data["type"]], **data}
        return data


# One typed `model:` section per family, told apart by `model.family` (voxrelay.models.registry).
ModelConfig = Annotated[Union[tuple(spec.config for spec in FAMILIES.values())],  # noqa: UP007
                        Field(discriminator="family")]


class CheckpointConfig(Section):
    every_steps: int | None = Field(100, gt=0, description="Save every N steps (None = off)")
    every_minutes: float | None = Field(None, gt=0, description="Save every N minutes (None = off)")
    every_epochs: int | None = Field(
        None, gt=0, description="Save when every N-th pass over the training data ends (None = off)"
    )
    adaptive_mtbf: str | None = Field(
        None,
        description="Expected mean time between failures (e.g. '6h'); when set, the time interval is adaptive: "
        "sqrt(2 x measured save cost x MTBF) (Young/Daly)",
    )
    keep_last: int = Field(2, ge=2, description="Committed checkpoints kept (>= 2: never delete the only one)")
    keep_every: int | None = Field(None, gt=0, description="Also keep every checkpoint whose step is a multiple of N")
    keep_best: bool = Field(False, description="Also keep the checkpoint with the lowest eval loss")
    max_staged: int = Field(3, ge=1, description="Staged checkpoints kept on local disk while uploads lag behind")
    grace_seconds: float = Field(25.0, ge=0, description="On SIGTERM/SIGINT/SIGUSR1: wait this long for the upload")
    final_upload_timeout: float = Field(
        600.0, gt=0, description="At the end of a run or a time limit: wait at most this many seconds for the last "
        "upload; then exit 76 with the checkpoint staged on local disk (its path is printed)",
    )
    preemption_poll: Literal["auto", "gcp", "aws", "off"] = Field(
        "auto", description="Poll the cloud metadata server for a preemption notice (auto: when running on GCP/AWS)"
    )
    metadata_url: str | None = Field(None, description="Override the metadata server base URL (tests, proxies)")
    max_failed_saves: int = Field(
        3, gt=0, description="Saves in a row that cannot be staged (a full disk, a failed write) after which training "
        "stops (exit 74, final: the reason named) instead of going on with nothing to resume from",
    )
    single_machine: bool = Field(
        False, description="One machine at a time trains this run. Needed for a local root on a FUSE mount "
        "(Colab's Google Drive, gcsfuse), where the run's lease excludes a second session on this machine but not "
        "another machine: such a root is refused without it (use root=gs://... for a lease across machines). "
        "No effect on other roots, whose lease excludes other machines too",
    )
    lease_seconds: float = Field(
        60.0, ge=1, description="The run's writer lease (<run>/lease.json) expires this long after its last "
        "renewal (renewed every third of it): how long a second `train` of the run is refused after its holder "
        "died elsewhere without releasing it (--take-over skips the wait)",
    )

    @field_validator("adaptive_mtbf")
    @classmethod
    def _mtbf(cls, v: str | None) -> str | None:
        parse_duration(v)
        return v


class MonitorConfig(Section):
    tensorboard: bool = Field(True, description="Write TensorBoard events to the run folder")
    wandb: bool = Field(False, description="Log to Weights & Biases (needs `pip install wandb`)")
    wandb_project: str = Field("voxrelay", description="wandb project name")


class CacheConfig(Section):
    max_gb: float = Field(
        20.0, gt=0, description="Local cache of prepared shards ($VOXRELAY_CACHE/prepared) is kept under this "
        "size; least recently used shards are evicted (staged checkpoints are not counted)",
    )
    ram_gb: float = Field(
        2.0, gt=0, description="Decoded shards each training process keeps in memory (least recently used "
        "evicted); at least one shard is kept. Keep it above shuffle_window x a shard's decoded size (RAM stays "
        "bounded whatever the corpus size)",
    )
    prefetch_shards: int = Field(
        8, ge=1, description="Shards each training process downloads ahead of use, in the order the batch plan "
        "needs them (4 download threads)",
    )
    models_uri: str | None = Field(
        "{root}/hf-cache", description="Where pretrained models from the Hugging Face hub (T5, DAC, SNAC, base LMs, "
        "tokenizers) are kept for later sessions: the first session downloads them from the hub and uploads them "
        "here, later ones copy them from here to $VOXRELAY_CACHE/hf-hub, 8 files at a time ({root}: the run's root; "
        "null: off, the hub every session)",
    )
    min_free_gb: float = Field(
        5.0, ge=0, description="A prefetched shard is not cached when caching it would leave less than this free "
        "on the cache's disk (it is read into memory instead): prefetching never fills the disk checkpoints "
        "are staged on",
    )


class RunConfig(Section):
    name: str = Field("demo", description="Run name; the run lives at <root>/runs/<name>/")
    root: str = Field(
        "./voxrelay-data", description="Storage root: a local folder, file://, gs://bucket/path or s3://bucket/path"
    )
    data: DataConfig = Field(default_factory=DataConfig)
    codec: CodecConfig = Field(default_factory=CodecConfig)
    model: ModelConfig = Field(default_factory=FAMILIES[DEFAULT_FAMILY].config)
    train: TrainConfig = Field(default_factory=TrainConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    monitor: MonitorConfig = Field(default_factory=MonitorConfig)
    cache: CacheConfig = Field(default_factory=CacheConfig)
    cost: CostConfig = Field(default_factory=CostConfig)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return _check_name(v, "run name")

    @field_validator("model", mode="before")
    @classmethod
    def _family(cls, v: Any) -> Any:
        """A section without `family` is the default family's (configs older than families); an unknown
        family is named here, with the known ones, rather than as pydantic's union-tag error."""
        if not isinstance(v, dict):
            return v
        family = v.get("family", DEFAULT_FAMILY)
        if family not in FAMILIES:
            raise ValueError(unknown_family(family))
        return {**v, "family": family}

    @model_validator(mode="after")
    def _family_trains(self) -> RunConfig:
        refusal = self.model.train_refusal(self.train.lora is not None)
        if refusal:
            raise ValueError(refusal)
        return self

    @property
    def models_uri(self) -> str | None:
        """``cache.models_uri`` with ``{root}`` filled in (None: off)."""
        uri = self.cache.models_uri
        return None if uri is None else uri.replace("{root}", self.root.rstrip("/"))

    @property
    def prepared_uri(self) -> str:
        from voxrelay import storage

        return storage.join(self.root, "prepared", self.data.name)

    @property
    def run_uri(self) -> str:
        from voxrelay import storage

        return storage.join(self.root, "runs", self.name)

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def hash(self) -> str:
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()[:16]


# Keys that may change when a run resumes; any other change makes the checkpoint incompatible
# (the run would not continue as if uninterrupted). Prefixes end with a dot.
RESUME_SAFE_KEYS = (
    "root", "name", "train.max_steps", "train.eval_every", "train.eval_synth", "train.log_every",
    "train.time_limit", "train.time_limit_from", "train.total_time_limit", "train.max_bad_steps",
    "train.early_stopping_patience",
    # how the same training is laid out in memory; a sharded checkpoint loads under any of them
    "train.fsdp_sharding", "train.gradient_checkpointing", "train.cpu_offload",
    "train.activation_offload", "train.ignore_plan", "train.compile",
    "train.kernels",
    "checkpoint.", "eval.", "monitor.", "cache.", "cost.",
    # a layout family's file path and the words about its layout: the layout's content (layout_spec) is compared
    "model.layout", "model.layout_spec.summary", "model.layout_spec.upstream", "model.layout_spec.sampling.",
)


def _flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, dict):
        out: dict[str, Any] = {}
        for key, value in data.items():
            out |= _flatten(value, f"{prefix}{key}.")
        return out
    return {prefix.rstrip("."): data}


def with_added_defaults(data: dict[str, Any]) -> dict[str, Any]:
    """A saved config with the keys added since it was written set to their defaults: a new key's
    default keeps the behaviour runs had before it existed (train.optimizer: adamw), so a run saved
    by an older voxrelay still resumes; a family config's ADDED_WITH_NEW_BEHAVIOUR gives the values its keys
    stand for where that is not so (TrainConfig's too). A config that no longer validates is compared as it is."""
    if isinstance(model := data.get("model"), dict):
        spec = FAMILIES.get(model.get("family", DEFAULT_FAMILY))
        data = {**data, "model": {**(spec.config.ADDED_WITH_NEW_BEHAVIOUR if spec else {}), **model}}
    if isinstance(train := data.get("train"), dict):
        if isinstance(lora := train.get("lora"), dict):
            train = {**train, "lora": {**LoraConfig.ADDED_WITH_NEW_BEHAVIOUR, **lora}}
        data = {**data, "train": {**TrainConfig.ADDED_WITH_NEW_BEHAVIOUR, **train}}
    try:
        return RunConfig.model_validate(data).to_dict()
    except ValidationError:
        return data


def config_changes(old: dict[str, Any], new: dict[str, Any]) -> tuple[list[str], list[str]]:
    """Dotted keys that differ between two config dicts -> (allowed on resume, incompatible).
    ``old`` (a checkpoint's) may lack keys added since; they count as their default."""
    a, b = _flatten(with_added_defaults(old)), _flatten(new)
    changed = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
    safe = [k for k in changed if any(k == s or (s.endswith(".") and k.startswith(s)) for s in RESUME_SAFE_KEYS)]
    return safe, [k for k in changed if k not in safe]


def _format_errors(err: ValidationError, source: str) -> str:
    lines = [f"invalid configuration ({source}):"]
    for e in err.errors():
        loc = list(e["loc"])
        if loc[:1] == ["model"] and len(loc) > 1 and loc[1] in FAMILIES:
            del loc[1]  # pydantic puts the union's tag in the path: model.<family>.hidden_size
        key = ".".join(str(p) for p in loc) or "(top level)"
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            from voxrelay.config.reference import near_key

            near = near_key(loc)
            msg = f"unknown key; did you mean {near}?" if near else "unknown key; check the spelling"
            msg += " (`voxrelay config show` lists every key)"
        got = e.get("input")
        got_s = "" if isinstance(got, dict) else f" (got {got!r})"
        lines.append(f"  {key}: {msg}{got_s}")
    return "\n".join(lines)


def build_config(data: dict[str, Any], source: str = "config") -> RunConfig:
    try:
        return RunConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_format_errors(err, source)) from None


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> RunConfig:
    """Read a YAML config (a local path or a storage URI such as gs://bucket/configs/x.yaml; None = all
    defaults), apply overrides, validate."""
    data: dict[str, Any] = {}
    source = "defaults" if path is None else str(path if "://" in str(path) else Path(path))
    if path is not None:
        try:
            data = yaml.safe_load(read_config_text(source)) or {}
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
            what = getattr(e, "problem", None) or one_line(e)
            raise ConfigError(f"{source}: not valid YAML{where}: {what}; fix the syntax (e.g. an unclosed [ or {{, "
                              "a tab used for indentation, a missing space after ':')") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{source}: the top level must be a mapping of sections (name, root, data, ...)")
    apply_overrides(data, overrides or [])
    return build_config(data, source)
