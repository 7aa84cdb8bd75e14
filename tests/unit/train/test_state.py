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
