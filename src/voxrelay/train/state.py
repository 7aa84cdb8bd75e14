"""Everything a run must carry across a kill, besides the weights: counters and RNG state.

All values are tensors or plain Python containers so ``torch.load(weights_only=True)`` reads them.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass

import numpy as np
import torch

from voxrelay.checkpoint.format import (  # noqa: F401 (defined in checkpoint/format.py)
    K_BASE_HASH,
    K_CONFIG,
    K_CONFIG_HASH,
    K_DATA,
    K_DATA_FINGERPRINT,
    K_FAMILY,
    K_LOOP,
    K_OPTIMIZER,
    K_RNG,
    K_SCALER,
    K_SCHEDULER,
    RNG_FAMILY,
)


@dataclass
class LoopState:
    """Loop counters; ``wall_time`` is seconds of training done across all sessions."""

    step: int = 0
    tokens_seen: int = 0
    audio_seconds_seen: float = 0.0
    wall_time: float = 0.0
    best_eval_loss: float = float("inf")
    evals_since_best: int = 0
    bad_steps: int = 0  # steps skipped for a non-finite loss or gradient norm, in all
    bad_in_a_row: int = 0
    scaler_skips: int = 0  # fp16: steps the GradScaler skipped (inf gradients: it lowers its scale), not bad steps

    def advance(self, tokens: int, audio_seconds: float, wall_time: float, finite: bool = True,
                scaler_skipped: bool = False) -> None:
        self.step += 1
        self.tokens_seen += tokens
        self.audio_seconds_seen += audio_seconds
        self.wall_time = wall_time
        self.bad_steps += not finite
        self.bad_in_a_row = 0 if finite else self.bad_in_a_row + 1
        self.scaler_skips += scaler_skipped

    def record_eval(self, loss: float) -> None:
        """Early-stopping bookkeeping: best eval loss and evaluations since it improved."""
        if loss < self.best_eval_loss:
            self.best_eval_loss, self.evals_since_best = loss, 0
        else:
            self.evals_since_best += 1

    def state_dict(self) -> dict:
        return asdict(self)

    def load_state_dict(self, state: dict) -> None:
        for key, value in state.items():
            setattr(self, key, value)


def rng_state(generators: dict[str, torch.Generator] | None = None) -> dict:
    """Python, numpy and torch RNG state of this process, and with CUDA that of its own device only (a
    process draws on one GPU; all of them would tie the checkpoint to the machine's GPU count), and
    the state of each of the family's own ``generators``."""
    np_state = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": (np_state[0], torch.from_numpy(np_state[1].copy()), *np_state[2:]),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()  # the current device's
    if generators:
        state[RNG_FAMILY] = {name: g.get_state() for name, g in generators.items()}
    return state


def set_rng_state(state: dict, generators: dict[str, torch.Generator] | None = None) -> None:
    """Restore :func:`rng_state` into this process, whatever GPUs this machine has: the saved CUDA state
    goes to the current device (none here: it is left out). Checkpoints of voxrelay < 0.2 hold a list,
    one state per visible device: the one of this process's device index is taken, else the first.
    The family's ``generators`` get their saved states (one missing from the checkpoint keeps its seed)."""
    saved = state.get(RNG_FAMILY) or {}
    for name, g in (generators or {}).items():
        if name in saved:
            g.set_state(saved[name])
    random.setstate(state["python"])
    kind, keys, *rest = state["numpy"]
    np.random.set_state((kind, keys.numpy(), *rest))
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda")
    if cuda is None or not torch.cuda.is_available():
        return
    if isinstance(cuda, list | tuple):
        if not cuda:
            return
        index = torch.cuda.current_device()
        cuda = cuda[index] if index < len(cuda) else cuda[0]
    torch.cuda.set_rng_state(cuda)


def seed_generators(generators: dict[str, torch.Generator], seed: int, rank: int) -> None:
    """Seed each of a family's generators from (``seed``, ``rank``, its name): independent streams per
    process and per generator, the same ones in every run of a seed."""
    import hashlib

    for name, g in generators.items():
        digest = hashlib.sha256(f"{seed}/{rank}/{name}".encode()).digest()
        g.manual_seed(int.from_bytes(digest[:8], "little") & (2**63 - 1))


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
