"""The loop and evaluation use only the family seam: the loss-token count comes from the family's
collate (no causal shift assumed in the loop), loss parts reach the eval metrics, and no file of
train/, inference or the CLI names a family."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.integration.runner import CONFIG
from tests.integration.tiny import tiny
from voxrelay.models.base import LOSS_TOKENS

SRC = Path(__file__).parents[3] / "src" / "voxrelay"


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
        run.checkpoints.close(5)


def test_train_step_normalises_by_the_count_the_family_gives(run):
    from voxrelay.train.loop import train_step

    batch = next(iter(run.stream))
    with torch.no_grad():
        loss_sum = float(run.model.loss(run.module, {k: v for k, v in batch.items() if k != "audio_seconds"}).loss_sum)
    counted = int(batch[LOSS_TOKENS])
    assert counted > 0
    batch[LOSS_TOKENS] = torch.tensor(3 * counted)  # a family whose targets the loop could not guess
    stats = train_step(run, [batch])
    assert stats.tokens == 3 * counted
    assert stats.loss == pytest.approx(loss_sum / (3 * counted), rel=1e-5)


def test_eval_logs_the_parts_of_the_loss(run):
    from voxrelay.train.evaluate import eval_loss

    class WithParts:
        """The run's model, with a loss that reports one part (as a per-codebook loss would)."""

        def __init__(self, inner):
            self.inner = inner

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def loss(self, module, batch):
            out = self.inner.loss(module, batch)
            return out._replace(parts={"half": out.loss_sum / 2})

    plain = eval_loss(run)
    inner, run.model = run.model, WithParts(run.model)
    try:
        with_parts = eval_loss(run)
    finally:
        run.model = inner
    assert set(plain) == {"eval/loss", "eval/text_gain"}
    assert with_parts["eval/loss"] == plain["eval/loss"]
    assert with_parts["eval/loss/half"] == pytest.approx(plain["eval/loss"] / 2)


@pytest.mark.parametrize("path", ["train/build.py", "train/loop.py", "train/evaluate.py", "train/resume.py",
                                  "train/strategies.py",
                                  "inference.py", "cli.py"])
def test_generic_code_names_no_family(path):
    text = (SRC / path).read_text()
    assert "codec_lm" not in text and "CodecLM" not in text
