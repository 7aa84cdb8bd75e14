"""build_run hands the loop a model in training mode, also when it is fine-tuned from pretrained
weights (transformers' from_pretrained returns eval mode, which would silently turn dropout off)."""

from __future__ import annotations

import pytest

from tests.helpers.runner import CONFIG, env_for, voxrelay
from tests.helpers.tiny import tiny

pytestmark = pytest.mark.slow  # tiers: see tests/conftest.py


def test_init_from_trains_with_dropout_on(tmp_path, monkeypatch):
    env, root = env_for(tmp_path / "cache"), str(tmp_path / "root")
    for args in (("prepare", CONFIG, *tiny(root)), ("train", CONFIG, *tiny(root, "train.max_steps=2")),
                 ("export", f"{root}/runs/demo", "-o", str(tmp_path / "export"))):
        res = voxrelay(*args, env=env)
        assert res.returncode == 0, res.stderr
    monkeypatch.setenv("VOXRELAY_CACHE", str(tmp_path / "cache"))
    from voxrelay.config import load_config
    from voxrelay.train.build import build_run

    cfg = load_config(CONFIG, tiny(root, "name=ft", "model.dropout=0.1", f"model.init_from={tmp_path / 'export'}"))
    run = build_run(cfg)
    try:
        module = run.accelerator.unwrap_model(run.module)
        assert module.config.attention_dropout == 0.1
        assert run.module.training and all(m.training for m in module.modules())
        assert run.lease._thread.is_alive()  # renewing while the run is held
    finally:
        assert run.close(5)
    # a run built and stepped by hand, then closed: nothing of it goes on in the process (a notebook's kernel)
    assert run.lease.released and not run.lease._thread.is_alive()


def test_a_second_run_in_the_same_process_may_train_in_another_precision():
    """A notebook that trained in bf16 and then starts an fp32 run in the same kernel: accelerate keeps one state per
    process and would refuse the second precision ("AcceleratorState has already been initialized")."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    from voxrelay.train.build import new_accelerator

    AcceleratorState._reset_state()
    try:
        Accelerator(mixed_precision="bf16", cpu=True)
        with pytest.raises(ValueError, match="already been initialized"):
            Accelerator(mixed_precision="no", cpu=True)  # what build_run met before
        assert new_accelerator("no").mixed_precision == "no"
        assert new_accelerator("no").mixed_precision == "no"  # the same precision: the state is kept
    finally:
        AcceleratorState._reset_state()
