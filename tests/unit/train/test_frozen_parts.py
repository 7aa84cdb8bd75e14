"""What a checkpoint holds, by rule: with a part of the model frozen by its family (here the token
embedding, as Parler freezes its text encoder), without LoRA, a checkpoint holds the trained tensors
only; resume and synthesis rebuild the frozen part from its source and refuse one whose content changed."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from tests.helpers.prepared import prepared_config
from tests.helpers.tiny import NO_SAVES
from voxrelay.checkpoint.manager import MODEL_FILE

FROZEN = "model.embed_tokens.weight"


@pytest.fixture
def frozen_family(monkeypatch):
    """The run's family with its token embedding frozen at build; ``shift`` changes the frozen weights'
    source (as another revision of a pretrained encoder would)."""
    import voxrelay.models.registry
    from voxrelay.models.registry import build_model

    source = {"shift": 0.0}

    def build_frozen(cfg, data, seed, meta=False):
        model = build_model(cfg, data, seed, meta=meta)
        emb = model.module.get_input_embeddings()
        with torch.no_grad():
            emb.weight.add_(source["shift"])
        emb.weight.requires_grad_(False)
        return model

    # training and inference rebuild a run's model through the registry's one path (model_for_run)
    monkeypatch.setattr(voxrelay.models.registry, "build_model", build_frozen)
    return source


def _run(tmp_path: Path, monkeypatch, shared: Path):
    from voxrelay.train.build import build_run

    cfg = prepared_config(tmp_path, monkeypatch, shared, "train.eval_synth=0", NO_SAVES, "model.dropout=0.1")
    return cfg, build_run


def test_a_frozen_part_is_rebuilt_not_checkpointed(tmp_path, monkeypatch, frozen_family, shared_tmp):
    from voxrelay.inference import load_from_run
    from voxrelay.train.loop import train_step
    from voxrelay.train.resume import save_checkpoint

    cfg, build_run = _run(tmp_path, monkeypatch, shared_tmp)
    run = build_run(cfg)
    try:
        assert run.base_hash is not None and FROZEN not in run.model_state()
        frozen = run.model.module.get_input_embeddings().weight.detach().clone()
        batches = iter(run.stream)
        for _ in range(2):
            train_step(run, [next(batches)])
            run.loop.advance(1, 0.0, 0.0)
        save_checkpoint(run, {}, background=False)
        assert run.close(60)
        trained = {k: v.detach().clone() for k, v in run.model_state().items()}
    finally:
        run.close(5)
        run.lease.release()
    folder = next((tmp_path / "root" / "runs" / cfg.name / "checkpoints").glob("step-*"))
    with safe_open(str(folder / MODEL_FILE), "pt") as f:
        saved = set(f.keys())
    assert saved == set(trained) and FROZEN not in saved  # the frozen part is not in the checkpoint
    assert torch.equal(run.model.module.get_input_embeddings().weight, frozen)  # and it did not train

    again = build_run(cfg)  # resume: the frozen part rebuilt from its source, the trained tensors loaded
    try:
        assert again.resumed_from == 2
        for name, value in again.model_state().items():
            assert torch.equal(value, trained[name]), name
        assert torch.equal(again.model.module.get_input_embeddings().weight, frozen)
    finally:
        again.close(5)
        again.lease.release()
    model, _, step = load_from_run(str(tmp_path / "root" / "runs" / cfg.name))
    assert step == 2 and torch.equal(model.module.get_input_embeddings().weight, frozen)
    assert all(torch.equal(model.module.state_dict()[k], v) for k, v in trained.items())


def test_a_frozen_part_whose_source_changed_is_refused(tmp_path, monkeypatch, frozen_family, shared_tmp):
    from voxrelay.inference import load_from_run
    from voxrelay.train.resume import save_checkpoint
    from voxrelay.train.strategies import BaseModelChangedError

    cfg, build_run = _run(tmp_path, monkeypatch, shared_tmp)
    run = build_run(cfg)
    try:
        run.loop.advance(1, 0.0, 0.0)
        save_checkpoint(run, {}, background=False)
        assert run.close(60)
    finally:
        run.close(5)
        run.lease.release()
    frozen_family["shift"] = 1e-3  # the encoder's source now gives other weights
    with pytest.raises(BaseModelChangedError, match="hash"):
        build_run(cfg)
    with pytest.raises(BaseModelChangedError, match="hash"):
        load_from_run(str(tmp_path / "root" / "runs" / cfg.name))
