"""What a checkpoint is, on disk and in the bucket: every file name, manifest key and training-state key, in one
place (the modules that write and read them import these names).

A run's checkpoints live in ``<run>/checkpoints/step-<8 digits>/``: the files below, then ``manifest.json`` written
last, which commits the checkpoint (its ``files`` name each file's size and sha256). A checkpoint of a model with
frozen parts holds the trainable tensors only (:mod:`voxrelay.checkpoint.frozen`); an FSDP run's holds DCP shards
(:mod:`voxrelay.checkpoint.sharded`) instead of ``model.safetensors``.
"""

from __future__ import annotations

# ---- files of a checkpoint folder
MANIFEST = "manifest.json"  # written last: its presence commits the checkpoint
FORMAT_VERSION = 1  # the manifest's format_version
PART_SUFFIX = ".part.json"  # a machine's record of the parts it uploaded (name -> size, sha256), written after them
MODEL_FILE = "model.safetensors"  # the weights (safetensors: no pickle), or the trainable ones
STATE_FILE = "train_state.pt"  # optimizer, scheduler, data cursor, RNG states (read with weights_only=True)
DCP_METADATA = ".metadata"  # a sharded checkpoint's DCP index (read by voxrelay.checkpoint.safe_dcp, no pickle)
FETCHED_DIR = "fetched"  # under the staging folder: a remote checkpoint read back to local disk

# ---- manifest keys (besides format_version, step, time, files)
ELSEWHERE = "elsewhere"  # files of the checkpoint staged (and uploaded) by other machines of the job
SHARDED = "sharded"  # value DCP for a sharded checkpoint
DCP = "dcp"
BASE_HASH = "base_hash"  # the frozen base's hash (voxrelay.checkpoint.frozen), read by synthesis and export
WRITER = "writer"  # the lease token of the session that saved it (voxrelay.checkpoint.lease)
STOPPED = "stopped"  # why the session stopped after this save (voxrelay.checkpoint.stops), when it did
METRICS = "metrics"  # the eval metrics of this step, when it was evaluated
CONFIG_HASH = "config_hash"

# ---- keys of train_state.pt
K_LOOP = "loop"
K_OPTIMIZER = "optimizer"
K_SCHEDULER = "scheduler"
K_DATA = "data"
K_RNG = "rng"
K_CONFIG_HASH = "config_hash"
K_CONFIG = "config"
K_SCALER = "grad_scaler"
K_DATA_FINGERPRINT = "data_fingerprint"
K_BASE_HASH = "base_hash"  # some part frozen: fingerprint of the model as built (frozen.base_hash); else None
K_FAMILY = "family"  # the family's extra state (FamilyModelBase.extra_state), when it has any
RNG_FAMILY = "family"  # key of an RNG state: the family's own generators (FamilyModelBase.generators), if any
