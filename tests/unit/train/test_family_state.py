"""A family's own state beside its weights (FamilyModelBase): its generators (seeded per process, saved and
restored with the RNG state), its extra state (an EMA, saved in every checkpoint) and its after-step
hook. A run of such a family resumed from a checkpoint ends exactly as a straight run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.helpers.runner import CONFIG
from tests.helpers.tiny import tiny
from voxrelay.models.base import LossTerm


class WithState:
    """The run's model plus a noise generator that scales its loss, and an EMA of its weights."""

    def __init__(self, inner):
        self.inner = inner
        self.noise = torch.Generator()
        self.ema = {n: p.detach().clone() for n, p in inner.module.named_parameters()}
        self.updates = 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    @property
    def module(self):
        return self.inner.module

    @module.setter
    def module(self, value):
        self.inner.module = value

    def generators(self):
        return {"noise": self.noise}

    def extra_state(self):
        return {f"ema/{n}": t.clone() for n, t in self.ema.items()} | {"updates": torch.tensor(self.updates)}

    def load_extra_state(self, state):
        self.ema = {n[len("ema/"):]: t.clone() for n, t in state.items() if n.startswith("ema/")}
        self.updates = int(state["updates"])

    def after_optimizer_step(self):
        for n, p in self.inner.module.named_parameters():
            self.ema[n].mul_(0.9).add_(p.detach(), alpha=0.1)
        self.updates += 1

    def loss(self, module, batch):
        ce = self.inner.loss(module, batch)["ce"]
        return {"ce": LossTerm(ce.sum * (1 + torch.rand((), generator=self.noise)), ce.count)}


def _train(tmp_path: Path, name: str, steps: int):
    from voxrelay.config import load_config
    from voxrelay.train.build import build_run
    from voxrelay.train.loop import train

    cfg = load_config(CONFIG, tiny(str(tmp_path / "root"), f"name={name}", f"train.max_steps={steps}",
                                   "train.eval_every=1000", "checkpoint.every_steps=2", "model.dropout=0.1"))
    run = build_run(cfg)
    resumed = run.resumed_from
    result = train(run)
    assert result.exit_code == 0
    return run.model, resumed


@pytest.fixture
def family_with_state(tmp_path, monkeypatch, tiny_prepared):
    import voxrelay.models.registry
    from voxrelay.models.registry import build_model

    tiny_prepared()
    # training rebuilds a run's model through the registry's one path (model_for_run)
    monkeypatch.setattr(voxrelay.models.registry, "build_model", lambda *a, **k: WithState(build_model(*a, **k)))


def test_generators_extra_state_and_after_step_hook_resume_exactly(tmp_path, family_with_state):
    straight, _ = _train(tmp_path, "straight", 4)
    _, first = _train(tmp_path, "split", 2)
    resumed, at = _train(tmp_path, "split", 4)  # a new session: rebuilt, restored from step 2
    assert first is None and at == 2
    assert straight.updates == resumed.updates == 4
    assert torch.equal(straight.noise.get_state(), resumed.noise.get_state())
    for n, p in straight.module.named_parameters():
        assert torch.equal(p, dict(resumed.module.named_parameters())[n]), n
        assert torch.equal(straight.ema[n], resumed.ema[n]), n
    assert any(not torch.equal(straight.ema[n], p) for n, p in straight.module.named_parameters())


def test_each_process_and_generator_gets_its_own_seeded_stream():
    from voxrelay.train.state import seed_generators

    def draws(seed: int, rank: int) -> list[float]:
        gens = {"noise": torch.Generator(), "timesteps": torch.Generator()}
        seed_generators(gens, seed, rank)
        return [float(torch.rand((), generator=g)) for g in gens.values()]

    assert draws(0, 0) == draws(0, 0)
    assert len({*draws(0, 0), *draws(0, 1), *draws(1, 0)}) == 6
