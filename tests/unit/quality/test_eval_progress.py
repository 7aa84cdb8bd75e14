"""Issue 33 H2, evals: training's lease is renewed only while training makes progress (30 min without a step, an
eval or a save and it is left to expire). An eval reports progress after each loss batch and each sample, so an
eval longer than that bound keeps the lease, and a hung one (no batch, no sample) does not."""

from __future__ import annotations

import numpy as np
import torch

from tests.unit.models.test_codec_lm import random_codes, tiny_model
from tests.unit.quality.test_requests import Codec
from voxrelay.checkpoint.lease import LeaseWatch, RunLease
from voxrelay.data.shards import EncodedUtterance
from voxrelay.quality.config import EvalConfig
from voxrelay.quality.evaluation import EvalParts, evaluate_model

MINUTES_PER_CALL = 10.0


class SlowClock:
    """A forced monotonic clock: every forward or sample of the eval takes 10 minutes on it, and the lease's
    renewal thread (run here, in order, instead of on a timer) looks after each."""

    def __init__(self) -> None:
        self.m = 0.0
        self.renewed: list[bool] = []
        self.lease: RunLease | None = None

    def __call__(self) -> float:
        return self.m

    def spend(self) -> None:
        self.m += MINUTES_PER_CALL * 60
        self.renewed.append(self.lease.renew_if_progressing())


def _slow(model, clock: SlowClock):
    loss, speak = model.loss, model.speak

    def slow_loss(module, batch):
        clock.spend()
        return loss(module, batch)

    def slow_speak(*args, **kwargs):
        clock.spend()
        return speak(*args, **kwargs)

    model.loss, model.speak = slow_loss, slow_speak
    return model


def test_an_eval_longer_than_the_progress_bound_keeps_the_lease(tmp_path) -> None:
    clock = SlowClock()
    lease = clock.lease = RunLease(str(tmp_path / "runs" / "r"), 60, watch=LeaseWatch(clock), pause=lambda s: None)
    lease.acquire()
    lease.progress()
    model = _slow(tiny_model(), clock)
    rows = [EncodedUtterance(f"text {i}", f"text {i}", None, None, 1.0, random_codes(6, seed=i)) for i in range(24)]
    parts = EvalParts(1, progress=lease.progress)
    out = evaluate_model(model, Codec(), rows, rows[:4], 1, 0, EvalConfig(asr=None, speaker_similarity=False),
                         None, parts, device=torch.device("cpu"))
    spent = len(clock.renewed) * MINUTES_PER_CALL
    assert spent >= 60 + 40 and np.isfinite(out.metrics["eval/loss"]) and len(out.samples) == 4  # > 3 × the bound
    assert all(clock.renewed), clock.renewed  # every look found progress within 30 min: renewed
    # and a hung eval (nothing more reported) lets it go once the bound passes
    clock.m += lease.progress_s + 1
    assert lease.renew_if_progressing() is False
