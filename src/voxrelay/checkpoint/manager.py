"""Checkpoints in the run folder: files first, ``manifest.json`` LAST (no manifest, no checkpoint).

Layout: ``<run>/checkpoints/step-00000100/{model.safetensors, train_state.pt, manifest.json}``.
``model.safetensors`` holds the weights; ``train_state.pt`` holds optimizer, scheduler, RNG, data
cursor and loop counters, saved with torch.save and loaded with ``weights_only=True`` (tensors and
plain containers only, never arbitrary pickles). The manifest lists every file with its size and
sha256; loading verifies them and falls back to the previous checkpoint, saying what was wrong.
Retention deletes old checkpoints only after a newer one is committed, and keeps >= 2.
"""

from __future__ import annotations

import hashlib
import io
import logging
import time
from dataclasses import dataclass

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from voxrelay import storage

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
MODEL_FILE = "model.safetensors"
STATE_FILE = "train_state.pt"
CKPT_DIR = "checkpoints"


class CheckpointError(RuntimeError):
    """A checkpoint is missing or damaged; the message says which file and what to do."""


@dataclass
class Checkpoint:
    step: int
    uri: str
    manifest: dict


def _step_dir(step: int) -> str:
    return f"step-{step:08d}"


class CheckpointManager:
    def __init__(self, run_uri: str, keep_last: int = 2):
        self.run_uri = run_uri
        self.keep_last = keep_last

    @property
    def root(self) -> str:
        return storage.join(self.run_uri, CKPT_DIR)

    def save(self, step: int, model_state: dict[str, torch.Tensor], train_state: dict) -> Checkpoint:
        """Write one checkpoint and commit it with its manifest, then apply retention."""
        uri = storage.join(self.root, _step_dir(step))
        files = {
            MODEL_FILE: st_save({k: v.detach().cpu().contiguous() for k, v in model_state.items()}),
            STATE_FILE: _torch_bytes(train_state),
        }
        entries = {}
        for name, data in files.items():
            storage.write_bytes(storage.join(uri, name), data)
            entries[name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        manifest = {"step": step, "time": time.time(), "files": entries, "format_version": 1}
        storage.write_json(storage.join(uri, MANIFEST), manifest)  # the commit
        self._retain()
        return Checkpoint(step, uri, manifest)

    def committed(self) -> list[Checkpoint]:
        """Committed checkpoints (a manifest exists), newest first; not verified."""
        out = []
        for name in reversed(storage.listdir(self.root)):
            if not name.startswith("step-"):
                continue
            uri = storage.join(self.root, name)
            if storage.exists(storage.join(uri, MANIFEST)):
                try:
                    out.append(Checkpoint(int(name[5:]), uri, storage.read_json(storage.join(uri, MANIFEST))))
                except (ValueError, KeyError) as err:
                    log.warning("ignoring %s: unreadable manifest (%s)", uri, err)
        return sorted(out, key=lambda c: c.step, reverse=True)

    def load_latest(self, step: int | None = None) -> tuple[Checkpoint, dict[str, torch.Tensor], dict] | None:
        """(checkpoint, model tensors, train state) of the newest valid checkpoint (or of ``step``)."""
        candidates = [c for c in self.committed() if step is None or c.step == step]
        if step is not None and not candidates:
            raise CheckpointError(f"no committed checkpoint at step {step} in {self.root}")
        for ckpt in candidates:
            try:
                files = self._verified_files(ckpt)
                model = st_load(files[MODEL_FILE])
                state = torch.load(io.BytesIO(files[STATE_FILE]), weights_only=True)
                return ckpt, model, state
            except CheckpointError as err:
                log.warning("checkpoint %s is damaged (%s); falling back to the previous one", ckpt.uri, err)
        if step is not None:
            raise CheckpointError(f"the checkpoint at step {step} is damaged; see the warnings above")
        return None

    def load_model(self, step: int | None = None) -> tuple[Checkpoint, dict[str, torch.Tensor]]:
        found = self.load_latest(step)
        if found is None:
            raise CheckpointError(f"no valid checkpoint in {self.root}; train first (voxrelay train CONFIG)")
        return found[0], found[1]

    def _verified_files(self, ckpt: Checkpoint) -> dict[str, bytes]:
        out = {}
        for name, meta in ckpt.manifest["files"].items():
            uri = storage.join(ckpt.uri, name)
            if not storage.exists(uri):
                raise CheckpointError(f"{name} is missing")
            data = storage.read_bytes(uri)
            if len(data) != meta["size"]:
                raise CheckpointError(f"{name} has {len(data)} bytes, the manifest says {meta['size']}")
            if hashlib.sha256(data).hexdigest() != meta["sha256"]:
                raise CheckpointError(f"{name} does not match its sha256 in the manifest")
            out[name] = data
        return out

    def _retain(self) -> None:
        """Delete committed checkpoints beyond keep_last (oldest first) and uncommitted leftovers
        older than the newest committed one (a save killed midway)."""
        committed = self.committed()
        for ckpt in committed[self.keep_last :]:
            storage.delete(storage.join(ckpt.uri, MANIFEST))  # uncommit first: never a half checkpoint
            storage.delete(ckpt.uri, recursive=True)
        newest = committed[0].step if committed else -1
        kept = {c.step for c in committed}
        for name in storage.listdir(self.root):
            if name.startswith("step-") and name[5:].isdigit():
                s = int(name[5:])
                if s < newest and s not in kept:
                    storage.delete(storage.join(self.root, name), recursive=True)


def _torch_bytes(obj: dict) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()
