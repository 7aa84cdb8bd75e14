"""The run against its memory plan: the pre-flight check before weights are loaded (stop with the plan's
table, or warn with train.ignore_plan) and an out-of-memory step (injected deterministically with a forward
hook raising torch.OutOfMemoryError, as CUDA's allocator does): the state of the last complete step is
saved with the failed step's batches still to train, exit 79, and the advice names the next-best strategy."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from tests.helpers.runner import CONFIG
from tests.helpers.tiny import NO_EVALS, NO_SAVES, tiny
from voxrelay.checkpoint.stops import EXIT_OUT_OF_MEMORY


@pytest.fixture
def prepared(tiny_prepared):
    from voxrelay.data.prepare import load_index

    cfg = tiny_prepared("train.max_steps=50", NO_EVALS, NO_SAVES, "train.log_every=1", "train.eval_synth=0")
    return cfg, load_index(cfg.prepared_uri)


def test_a_strategy_that_will_not_fit_stops_before_loading_with_the_plan(prepared, caplog):
    from voxrelay.config import load_config
    from voxrelay.plan import configured
    from voxrelay.plan.fit import WillNotFitError, check_fits, plan_of

    cfg, index = prepared
    need = next(r for r in plan_of(cfg, index, 1, 10**12).rows if r.strategy == configured(cfg, 1))
    need = need.per_gpu_bytes["total"]
    check_fits(cfg, index, 1, need + 1)  # fits: nothing happens
    with pytest.raises(WillNotFitError) as err:
        check_fits(cfg, index, 1, need - 1)
    text = str(err.value)
    assert "more than this GPU's" in text and "train.ignore_plan=true" in text and "ddp full" in text
    assert "try train." in text  # a strategy the plan says needs less, as overrides
    check_fits(cfg, index, 1, None)  # no GPU: no check
    ignoring = load_config(CONFIG, [*tiny(str(cfg.root)), "train.ignore_plan=true"])
    with caplog.at_level(logging.WARNING):
        check_fits(ignoring, index, 1, need - 1)
    assert "going on because train.ignore_plan is set" in caplog.text


def test_out_of_memory_saves_the_last_complete_step_and_names_the_next_best_strategy(prepared, caplog):
    from voxrelay.train.build import build_run
    from voxrelay.train.loop import OUT_OF_MEMORY, train, train_step

    cfg, _ = prepared
    run = build_run(cfg)
    try:
        batches = iter(run.stream)
        train_step(run, [next(batches)])
        run.loop.advance(1, 1.0, 1.0)
        good = {k: v.clone() for k, v in run.model.module.state_dict().items()}
        cursor = run.stream.state_dict()
        run.stream.load_state_dict(cursor)  # the loop starts its own iterator at the cursor

        def oom(module, _inputs, _output):
            if module.training:  # the baseline evaluation fits; the training step does not
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

        run.model.module.get_input_embeddings().register_forward_hook(oom)
        with caplog.at_level(logging.ERROR):
            result = train(run)
        assert (result.exit_code, result.stop_reason, result.step, result.durable) == \
            (EXIT_OUT_OF_MEMORY, OUT_OF_MEMORY, 1, True)
        assert "next-best strategy here is" in caplog.text and "re-run with train." in caplog.text
        ckpt, weights, _ = run.checkpoints.load_model()
        assert ckpt.step == 1 and all(torch.equal(weights[k], good[k]) for k in good)
        _, _, state = run.checkpoints.load(1)
        assert state["data"] == cursor  # the failed step's batches are trained again on resume
        manifest = json.loads((run.local_dir / "checkpoints/step-00000001/manifest.json").read_text())
        assert manifest.get("stopped") == OUT_OF_MEMORY
    finally:
        run.close(5)
