import random

import numpy as np
import torch

from voxrelay.train.state import LoopState, rng_state, seed_everything, set_rng_state


def test_early_stopping_bookkeeping_and_round_trip():
    loop = LoopState()
    for loss in (3.0, 2.0, 2.5, 2.1, 1.9, 2.0):
        loop.record_eval(loss)
    assert loop.best_eval_loss == 1.9 and loop.evals_since_best == 1
    loop.advance(tokens=10, audio_seconds=1.5, wall_time=12.0)
    again = LoopState()
    again.load_state_dict(loop.state_dict())
    assert again == loop and again.step == 1 and again.wall_time == 12.0


def test_rng_state_round_trip_survives_weights_only_load(tmp_path):
    seed_everything(3)
    state = rng_state()
    torch.save(state, tmp_path / "rng.pt")
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    set_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True))
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected


class FakeGPUs:
    """torch.cuda of a machine with ``count`` GPUs, this process on ``current``: each device an RNG state
    (a byte tensor); indexing a device that is not there raises as CUDA does."""

    def __init__(self, count: int, current: int = 0):
        self.states = [torch.full((16,), i, dtype=torch.uint8) for i in range(count)]
        self.current = current

    def install(self, monkeypatch) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: bool(self.states))
        monkeypatch.setattr(torch.cuda, "device_count", lambda: len(self.states))
        monkeypatch.setattr(torch.cuda, "current_device", lambda: self.current)
        monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device="cuda": self.states[self._index(device)].clone())
        monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: [s.clone() for s in self.states])
        monkeypatch.setattr(torch.cuda, "set_rng_state", self._set)
        monkeypatch.setattr(torch.cuda, "set_rng_state_all",
                            lambda states: [self._set(s, i) for i, s in enumerate(states)])

    def _index(self, device) -> int:
        index = self.current if device in ("cuda", None) else int(device)
        if index >= len(self.states):
            raise IndexError(f"device {index} of {len(self.states)}")  # what torch.cuda does (CUDA error)
        return index

    def _set(self, state, device="cuda") -> None:
        self.states[self._index(device)] = state.clone()


def test_rng_state_holds_this_process_device_only(monkeypatch):
    FakeGPUs(4, current=2).install(monkeypatch)
    state = rng_state()
    assert torch.equal(state["cuda"], torch.full((16,), 2, dtype=torch.uint8))  # one device: not four


def test_a_checkpoint_of_a_4_gpu_machine_resumes_on_1_gpu_and_on_none(monkeypatch, tmp_path):
    four = FakeGPUs(4, current=0)
    four.install(monkeypatch)
    four.states = [torch.full((16,), 10 + i, dtype=torch.uint8) for i in range(4)]
    saved = rng_state() | {"cuda": torch.cuda.get_rng_state_all()}  # as voxrelay saved it before: every device
    torch.save(saved, tmp_path / "rng.pt")
    one = FakeGPUs(1)
    one.install(monkeypatch)
    set_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True))  # raised IndexError on every attempt
    assert torch.equal(one.states[0], torch.full((16,), 10, dtype=torch.uint8))  # device 0's state
    FakeGPUs(0).install(monkeypatch)  # a CPU machine: the CUDA state has no place, the rest is restored
    set_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True))
    new = rng_state()
    assert "cuda" not in new and torch.equal(new["torch"], saved["torch"])
