"""Each part of an eval fails on its own (the loss, sample generation, speaker similarity, a sink): a warning names
the part, ``eval/failed_parts`` counts them, and whatever else the eval computed is logged and reaches early
stopping and keep_best, during training and in `voxrelay eval`."""

from __future__ import annotations

import json
import logging

from typer.testing import CliRunner


def _jsonl(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_each_part_of_an_eval_fails_on_its_own_and_the_rest_is_logged(tmp_path, monkeypatch, caplog, tiny_prepared):
    from voxrelay.cli import app
    from voxrelay.monitor.sinks import TensorBoardSink
    from voxrelay.quality.speaker import SpeakerEncoder
    from voxrelay.train.build import build_run
    from voxrelay.train.loop import train

    cfg = tiny_prepared("train.max_steps=2", "train.eval_every=1", "checkpoint.every_steps=1",
                        "checkpoint.keep_best=true", "eval.speaker_similarity=true")
    run = build_run(cfg)
    speak, loss = run.model.speak, run.model.loss

    def speak_fails_at_step_0(*args, **kwargs):
        if run.loop.step == 0:
            raise RuntimeError("CUDA error: device-side assert triggered")
        return speak(*args, **kwargs)

    def eval_loss_fails_at_step_2(module, batch):
        if not module.training and run.loop.step == 2:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return loss(module, batch)

    def fails_at_step_2(method):
        def broken(*args, **kwargs):
            if run.loop.step == 2:
                raise OSError(28, "No space left on device")
            return method(*args, **kwargs)
        return broken

    monkeypatch.setattr(run.model, "speak", speak_fails_at_step_0)
    monkeypatch.setattr(run.model, "loss", eval_loss_fails_at_step_2)
    (board,) = [s for s in run.monitor.sinks if isinstance(s, TensorBoardSink)]
    monkeypatch.setattr(board.writer, "add_audio", fails_at_step_2(board.writer.add_audio))
    monkeypatch.setattr(SpeakerEncoder, "embed", fails_at_step_2(SpeakerEncoder.embed))
    caplog.set_level(logging.WARNING)
    result = train(run)

    assert result.exit_code == 0 and result.durable
    first, whole, last = [m for m in _jsonl(run.local_dir / "metrics.jsonl") if any(k.startswith("eval/") for k in m)]
    assert first["step"] == 0 and "eval/loss" in first and first["eval/failed_parts"] == 1
    assert "eval/silent_frac" not in first  # nothing was generated
    assert whole["step"] == 1 and "eval/failed_parts" not in whole and {"eval/loss", "eval/speaker_sim"} <= set(whole)
    assert last["step"] == 2 and "eval/loss" not in last and last["eval/failed_parts"] == 3
    assert {"eval/silent_frac", "eval/mcd_dtw", "eval/stopped_frac"} <= set(last)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    for part, step, why in (("sample generation", 0, "device-side assert"), ("loss", 2, "CUDA out of memory"),
                            ("TensorBoardSink audio", 2, "No space left"), ("speaker similarity", 2, "No space left")):
        assert any(f"eval of step {step}: {part} failed" in w and why in w for w in warnings), (part, warnings)
    # early stopping counted step 1's loss, and step 2's missing loss not as "no better"; keep_best sees step 1's
    assert (run.loop.best_eval_loss, run.loop.evals_since_best) == (whole["eval/loss"], 0)
    saved = {c.step: c.metrics for c in run.checkpoints.store.list()}
    assert saved[1]["eval/loss"] == whole["eval/loss"] and "eval/loss" not in saved[2]
    assert len(list((run.local_dir / "samples" / "step-00000002").glob("*.wav"))) == 1  # saved: TensorBoard failed

    caplog.clear()  # `voxrelay eval` of step 2 (the speaker encoder still fails): the same parts, guarded alike
    res = CliRunner().invoke(app, ["eval", str(run.local_dir), "--json"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    (scored,) = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
    assert scored["eval/failed_parts"] == 1 and {"eval/loss", "eval/mcd_dtw"} <= set(scored)
    assert "eval of step 2: speaker similarity failed" in caplog.text
