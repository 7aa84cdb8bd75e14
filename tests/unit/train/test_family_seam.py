"""The loop and evaluation use only the family seam: each loss term's count comes from the family's
collate (no causal shift assumed in the loop), the objective is the weighted sum of the terms' means,
every term reaches the training and eval metrics, and no file outside models/ names a family."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from tests.helpers.runner import CONFIG
from tests.helpers.tiny import tiny
from voxrelay.models.base import LOSS_COUNT, LossTerm

SRC = Path(__file__).parents[3] / "src" / "voxrelay"
# getattr(x, "name" ...) / hasattr(x.y(), "name"): the string is what is probed
PROBE = re.compile(r"\b(?:getattr|hasattr)\([^,()]+(?:\([^()]*\))?,\s*[\"'](\w+)[\"']")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from voxrelay.config import load_config
    from voxrelay.data.prepare import prepare
    from voxrelay.train.build import build_run

    tmp = tmp_path_factory.mktemp("seam")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VOXRELAY_CACHE", str(tmp / "cache"))
        cfg = load_config(CONFIG, tiny(str(tmp / "root"), "train.eval_synth=0", "checkpoint.every_steps=1000"))
        prepare(cfg)
        run = build_run(cfg)
        yield run
        run.close(5)


def _plain(batch: dict) -> dict:
    return {k: v for k, v in batch.items() if k != "audio_seconds" and not k.startswith(LOSS_COUNT)}


def test_train_step_normalises_by_the_count_the_family_gives(run):
    from voxrelay.train.loop import train_step

    batch = next(iter(run.stream))
    with torch.no_grad():
        ce = run.model.loss(run.module, _plain(batch))["ce"]
    counted = int(batch[LOSS_COUNT + "ce"])
    assert counted == int(ce.count) > 0
    batch[LOSS_COUNT + "ce"] = torch.tensor(3 * counted)  # a family whose targets the loop could not guess
    stats = train_step(run, [batch])
    assert stats.tokens == 3 * counted
    assert stats.loss == pytest.approx(float(ce.sum) / (3 * counted), rel=1e-5)
    assert stats.terms == {"ce": stats.loss}


class TwoTerms:
    """The run's model with a second loss term, ``twice``: twice the ce sum over 4x its targets, weighted
    ``weight`` (as a per-codebook or diffusion term would be), counted by collate as the loop needs."""

    def __init__(self, inner, weight: float):
        self.inner, self.weight = inner, weight

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def collate(self, examples):
        batch = self.inner.collate(examples)
        return batch | {LOSS_COUNT + "twice": 4 * batch[LOSS_COUNT + "ce"]}

    def loss(self, module, batch):
        terms = self.inner.loss(module, batch)
        ce = terms["ce"]
        return terms | {"twice": LossTerm(2 * ce.sum, 4 * ce.count, self.weight)}


def _grads(run, batches, model) -> list[torch.Tensor]:
    """The gradient train_step applies (its optimizer step replaced by a copy of the gradients)."""
    from voxrelay.train.loop import train_step

    seen = []
    step, inner = run.optimizer.step, run.model
    run.optimizer.step = lambda: seen.extend(p.grad.clone() for p in run.module.parameters() if p.grad is not None)
    run.model = model
    try:
        stats = train_step(run, [dict(b) for b in batches])
    finally:
        run.optimizer.step, run.model = step, inner
    return seen, stats


@pytest.mark.parametrize("weight", [0.25, 0.0])
def test_the_objective_is_the_weighted_sum_of_each_terms_mean_over_the_step(run, weight):
    rows = run.eval_rows
    plain = [run.model.collate([run.model.example(r) for r in rows[i:i + 1]]) for i in range(2)]
    two = TwoTerms(run.model, weight)
    both = [two.collate([run.model.example(r) for r in rows[i:i + 1]]) for i in range(2)]
    for b in plain + both:
        b["audio_seconds"] = 1.0
    run.module.eval()  # no dropout: the two steps see the same function
    try:
        g_plain, s_plain = _grads(run, plain, run.model)
        g_two, s_two = _grads(run, both, two)
    finally:
        run.module.train()
    # twice / (4 ce count) = ce mean / 2: the objective is (1 + weight / 2) x the ce mean, and so is its gradient
    factor = 1 + weight / 2
    assert s_two.terms["ce"] == pytest.approx(s_plain.loss, rel=1e-6)
    assert s_two.terms["twice"] == pytest.approx(s_plain.loss / 2, rel=1e-6)
    assert s_two.loss == pytest.approx(factor * s_plain.loss, rel=1e-6)
    assert s_two.tokens == (5 if weight else 1) * s_plain.tokens  # a monitored-only term is no throughput
    assert len(g_two) == len(g_plain) > 0
    for a, b in zip(g_two, g_plain, strict=True):
        torch.testing.assert_close(a, factor * b, rtol=1e-4, atol=1e-7)


def test_eval_logs_every_term_and_the_weighted_objective(run):
    from voxrelay.train.evaluate import eval_loss

    plain = eval_loss(run)
    inner, run.model = run.model, TwoTerms(run.model, 0.5)
    try:
        two = eval_loss(run)
    finally:
        run.model = inner
    assert set(plain) == {"eval/loss", "eval/loss/ce", "eval/text_gain"}
    assert plain["eval/loss/ce"] == plain["eval/loss"]
    assert two["eval/loss/ce"] == pytest.approx(plain["eval/loss"])
    assert two["eval/loss/twice"] == pytest.approx(plain["eval/loss"] / 2)
    assert two["eval/loss"] == pytest.approx(1.25 * plain["eval/loss"])
    assert two["eval/text_gain"] == pytest.approx(1.25 * plain["eval/text_gain"], rel=1e-4)


def test_a_term_the_collate_did_not_count_is_refused(run):
    from voxrelay.train.loop import _objective

    term = LossTerm(torch.tensor(1.0, requires_grad=True), torch.tensor(3))
    with pytest.raises(KeyError, match="'extra' has no count"):
        _objective({"extra": term}, {"ce": 1.0})
    assert float(_objective({"ce": term, "watch": LossTerm(torch.tensor(float("nan")), torch.tensor(1), 0.0)},
                            {"ce": 0.5})) == 0.5  # a weight-0 term is left out of the gradient


def test_no_file_outside_models_names_a_family():
    """Generic code (the loop, checkpoints, plan, data, the CLI, config) reaches a family only through the
    registry in models/: a new family is a folder there plus its registry lines."""
    import re

    from voxrelay.models.registry import FAMILIES

    # a family's name as a word (not an eSpeak voice variant such as "+f5")
    pattern = re.compile(r"(?<![+\w])(" + "|".join(map(re.escape, FAMILIES)) + r")\b")
    named = [f"{path.relative_to(SRC)}:{n}: {line.strip()}"
             for path in sorted(SRC.rglob("*.py")) if path.relative_to(SRC).parts[0] != "models"
             for n, line in enumerate(path.read_text().splitlines(), 1) if pattern.search(line)]
    assert len(FAMILIES) >= 2 and not named, "\n".join(named)


def _hook_names() -> set[str]:
    """Every name a family declares: its built model's hooks (FamilyModel, FamilyModelBase), its config section's
    hooks and keys (FamilyConfig and each family's own), and its spec's fields."""
    import dataclasses

    from voxrelay.models.base import FamilyModel
    from voxrelay.models.registry import FAMILIES
    from voxrelay.models.seam import FamilyConfig, FamilyModelBase, FamilySpec

    names = {n for cls in (FamilyModel, FamilyModelBase, FamilyConfig) for n in vars(cls) if not n.startswith("_")}
    names |= set(FamilyModel.__annotations__) | {f.name for f in dataclasses.fields(FamilySpec)}
    names |= {key for spec in FAMILIES.values() for key in spec.config.model_fields}
    names |= {n for spec in FAMILIES.values() for n in vars(spec.config) if n.isupper()}  # CHANGED_DEFAULTS ...
    return names - {"model_config", "name"}


def test_no_file_outside_models_probes_a_family_hook():
    """Outside models/, a family hook or a family's config key is called as declared (with its default in
    models/seam.py), never probed with hasattr/getattr: a family that lacks one is a bug the seam shows, not a
    silent default (a forgotten frame_rate once meant frame limits in codec frames, 24,000 a second)."""
    hooks = _hook_names()
    assert {"frame_rate", "uses_corpus", "plan_shape", "export_formats", "fsdp_forward_methods",
            "voice_references", "spoken_text", "ADDED_WITH_NEW_BEHAVIOUR", "data_needs", "audio_embedding",
            "feature_cache_gb", "init_from"} <= hooks
    found = [f"{path.relative_to(SRC)}:{n}: {line.strip()}"
             for path in sorted(SRC.rglob("*.py")) if path.relative_to(SRC).parts[0] != "models"
             for n, line in enumerate(path.read_text().splitlines(), 1)
             for name in PROBE.findall(line) if name in hooks]
    assert not found, "\n".join(found)


def test_the_probe_check_sees_a_probe():
    """The pattern above catches the probes it was written for (a check that matches nothing proves nothing)."""
    assert PROBE.findall('rate = getattr(model, "frame_rate", None) or codec.frame_rate') == ["frame_rate"]
    assert PROBE.findall('if hasattr(type(cfg.model), "CHANGED_DEFAULTS"):') == ["CHANGED_DEFAULTS"]
    assert PROBE.findall("x = getattr(self.model, 'audio_embedding', 'free')") == ["audio_embedding"]


def test_an_eval_gives_training_its_rng_back(run):
    """Whatever an eval draws (a speaker encoder initialised when it loads, a family's noisy eval loss) must
    not move training's random streams: a resumed session evaluates at other steps than a straight one."""
    import numpy as np

    from voxrelay.train.evaluate import evaluate

    class Drawing:
        def __init__(self, inner):
            self.inner = inner

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def loss(self, module, batch):
            torch.rand(3), np.random.rand(3)  # noqa: B018 (draws, as a model built at eval time would)
            return self.inner.loss(module, batch)

    torch_state, np_state = torch.get_rng_state().clone(), np.random.get_state()[1].copy()
    inner, run.model = run.model, Drawing(run.model)
    try:
        results = evaluate(run, 1)
    finally:
        run.model = inner
    assert "eval/loss" in results
    assert torch.equal(torch.get_rng_state(), torch_state) and np.array_equal(np.random.get_state()[1], np_state)
