"""(issue 33 H1) Every rank reaches every collective: an error on one rank inside the eval (Whisper out of GPU
memory on rank 0, the only rank that scores) or inside a save (a state that cannot be copied) is caught and
agreed on, never a barrier one rank skips while the others wait in it until the 30-minute timeouts.

A real two-process DDP job on gloo (torchrun, this file as its script) trains 4 steps, evaluating and saving at
steps 2 and 4; rank 0's eval, or its save, of step 2 fails (with fsdp: rank 1's copy of its shards). Both ranks
log the eval of step 2 as failed (or the failing rank counts the save as failed), train on and finish together:
exit 0, step 4 committed. (It used to hang in mismatched collectives, or crash; the launch is bounded, so a
regression fails instead of hanging.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.distributed]  # tiers: see tests/conftest.py

WORLD, FAILING_STEP = 2, 2


def _config(root: str, fault: str = "eval"):
    from tests.helpers.runner import CONFIG
    from tests.helpers.tiny import tiny
    from voxrelay.config import load_config

    sharded = ("train.strategy=fsdp", "train.schedule=constant") if fault == "sharded" else ()
    return load_config(CONFIG, tiny(root, "name=ranks", "train.max_steps=4", "train.eval_every=2",
                                    "train.eval_synth=1", "checkpoint.every_steps=2", "train.log_every=1", *sharded))


@pytest.mark.parametrize("fault", ["eval", "save", "sharded"])
def test_an_error_on_one_rank_in_eval_or_save_is_agreed_on_and_nobody_hangs(tmp_path, fault):
    from tests.helpers.runner import _kill_tree
    from tests.helpers.servers import free_port
    from voxrelay.checkpoint.store import CommittedStore
    from voxrelay.data.prepare import prepare

    repo = str(Path(__file__).resolve().parents[3])  # the script imports tests.* too
    env = dict(os.environ, OMP_NUM_THREADS="1", VOXRELAY_CACHE=str(tmp_path / "cache"),
               PYTHONPATH=os.pathsep.join(p for p in (repo, os.environ.get("PYTHONPATH")) if p))
    os.environ["VOXRELAY_CACHE"] = env["VOXRELAY_CACHE"]
    cfg = _config(str(tmp_path / "root"), fault)
    prepare(cfg)
    job = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes=1", f"--nproc-per-node={WORLD}",
                            f"--master-port={free_port()}", __file__, str(tmp_path), fault], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out = job.communicate(timeout=180)[0]  # a rank left in a collective would wait 30 minutes
    except subprocess.TimeoutExpired:
        _kill_tree(job.pid)
        raise AssertionError(f"the job hung: {job.communicate()[0][-4000:]}") from None
    assert job.returncode == 0, out[-6000:]
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]
    for r in results:
        assert (r["exit_code"], r["step"], r["durable"]) == (0, 4, True), (r, out[-6000:])
    flat = " ".join(out.split())
    committed = [c.step for c in CommittedStore(f"{cfg.run_uri}/checkpoints").list()]
    if fault == "eval":
        assert flat.count(f"the eval of step {FAILING_STEP} failed") == WORLD, out[-6000:]  # every rank learnt it
        assert "OutOfMemoryError" in flat and "on rank 0" in flat
        assert committed == [4, 2]  # the eval failed, its step's checkpoint did not
    else:  # counted on rank 0 (checkpoint.max_failed_saves), not raised; the next save goes through
        failing = 1 if fault == "sharded" else 0  # fsdp: rank 1 alone fails to copy its shards (before DCP)
        assert results[failing]["failed_saves_seen"] == 1 and "No space left on device" in flat, out[-6000:]
        assert committed == [4]


def _worker(tmp: Path, fault: str) -> None:
    """One rank of the job: rank 0's scorer runs out of memory (``fault`` eval) or its state copy fails (save), or,
    sharded (fsdp), rank 1's copy of its shards fails, at step 2 only."""
    import torch

    from voxrelay.train.build import build_run
    from voxrelay.train.loop import train

    run = build_run(_config(str(tmp / "root"), fault))
    seen = {"failed_saves": 0}
    if fault == "sharded" and run.ranks.rank == 1:
        from voxrelay.checkpoint import shard_saver as sharded

        state_dicts = sharded._state_dicts

        def shards_or_failure(*args):
            if run.loop.step == FAILING_STEP:
                seen["failed_saves"] += 1
                raise OSError(28, "No space left on device")
            return state_dicts(*args)

        sharded._state_dicts = shards_or_failure
    if run.ranks.main:
        scorer, model_state = run.scorer, run.model_state

        class OutOfMemoryAtStep2:  # Whisper on the GPU next to the model: rank 0 alone scores
            def score(self, samples, *rest):
                if run.loop.step == FAILING_STEP:
                    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (in Whisper)")
                return scorer.score(samples, *rest) if scorer is not None else ({}, [])

        def state_or_failure():
            if run.loop.step == FAILING_STEP:
                seen["failed_saves"] += 1
                raise OSError(28, "No space left on device")
            return model_state()

        if fault == "eval":
            run.scorer = OutOfMemoryAtStep2()
        else:
            run.model_state = state_or_failure
    result = train(run)
    (tmp / f"rank{run.ranks.rank}.json").write_text(json.dumps({
        "exit_code": result.exit_code, "step": result.step, "durable": result.durable,
        "failed_saves_seen": seen["failed_saves"]}))


if __name__ == "__main__":
    _worker(Path(sys.argv[1]), sys.argv[2])
