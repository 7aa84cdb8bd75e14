"""Seed 001's own accelerate config (tests/fixtures/accelerate/orpheus_user_fsdp.yaml): every setting accelerate's
launcher passes to the processes is taken (its `mixed_precision: bf16` included: before, train.precision's default
"no" went to the Accelerator and won), left to accelerate, done as voxrelay does anyway, or named as not applied;
the voxrelay config's own keys win; the lines are said by the job's first process only (issue 32 item 7)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from voxrelay.config import load_config
from voxrelay.train.launch_env import BY_ACCELERATE, MAPPED, accelerate_settings, apply_accelerate_env

SEED_001 = Path(__file__).resolve().parents[2] / "fixtures" / "accelerate" / "orpheus_user_fsdp.yaml"


def launched_env(config: Path, *overrides: str) -> dict[str, str]:
    """The environment `accelerate launch --config_file config *overrides -m voxrelay train` gives its processes,
    computed by accelerate's own launcher code (its FSDP launch path; nothing is started)."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_multi_gpu_env

    args = launch_command_parser().parse_args(["--config_file", str(config), *overrides, "-m", "voxrelay", "train"])
    args, _, _ = _validate_launch_command(args)
    assert args.use_fsdp and not args.cpu  # the launch path of an FSDP config (see the fixture's README)
    return dict(prepare_multi_gpu_env(args))


@pytest.fixture(scope="module")
def seed_env() -> dict[str, str]:
    return launched_env(SEED_001, "--num_processes", "2")  # on a CPU: 2 processes, else as the user wrote it


def test_every_setting_of_seed_001_is_taken_or_named(seed_env, caplog, monkeypatch) -> None:
    monkeypatch.delenv("RANK", raising=False)
    with caplog.at_level(logging.INFO, logger="voxrelay.train.launch_env"):
        cfg = apply_accelerate_env(load_config(None, []), dict(seed_env))
    t = cfg.train
    assert (t.precision, t.strategy, t.fsdp_sharding, t.cpu_offload) == ("bf16", "fsdp", "full_shard", False)
    _, same, other = accelerate_settings(seed_env)
    assert other == {"FSDP_CPU_RAM_EFFICIENT_LOADING=true": "every process builds the model, then shards it"}
    exported = {k: v for k, v in seed_env.items() if k.startswith(("ACCELERATE_", "FSDP_"))}
    unaccounted = [f"{k}={v}" for k, v in exported.items() if k not in MAPPED | BY_ACCELERATE
                   and f"{k}={v}" not in same | other and v.lower() not in ("false", "no", "0")]
    assert unaccounted == []
    said = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert [level for level, _ in said] == ["INFO", "WARNING"]
    assert "taken: train.strategy=fsdp, train.fsdp_sharding=full_shard" in said[0][1]
    assert "train.precision=bf16" in said[0][1] and "FSDP_USE_ORIG_PARAMS=true" in said[0][1]
    assert said[1][1] == ("accelerate launch config: not applied: FSDP_CPU_RAM_EFFICIENT_LOADING=true (every "
                          "process builds the model, then shards it)")


def test_the_voxrelay_configs_own_precision_wins_and_other_processes_say_nothing(seed_env, caplog,
                                                                                  monkeypatch) -> None:
    monkeypatch.setenv("RANK", "1")  # the job's second process
    with caplog.at_level(logging.INFO, logger="voxrelay.train.launch_env"):
        cfg = apply_accelerate_env(load_config(None, ["train.precision=no"]), dict(seed_env))
    assert (cfg.train.precision, cfg.train.strategy) == ("no", "fsdp")
    assert caplog.records == []
    monkeypatch.setenv("RANK", "0")
    with caplog.at_level(logging.INFO, logger="voxrelay.train.launch_env"):
        apply_accelerate_env(load_config(None, ["train.precision=no"]), dict(seed_env))
    assert "the voxrelay config's own keys win: train.precision=no" in caplog.records[0].getMessage()


def test_a_plain_ddp_launch_takes_its_precision_too(tmp_path: Path) -> None:
    """Not FSDP: accelerate's multi-GPU launch of the same user's bf16 (its env as the launcher writes it)."""
    env = {"ACCELERATE_MIXED_PRECISION": "bf16", "ACCELERATE_DYNAMO_BACKEND": "NO", "ACCELERATE_USE_CPU": "False"}
    cfg = apply_accelerate_env(load_config(None, []), env)
    assert (cfg.train.precision, cfg.train.strategy) == ("bf16", "ddp")
    assert accelerate_settings({**env, "ACCELERATE_DYNAMO_BACKEND": "INDUCTOR"})[2] == {
        "ACCELERATE_DYNAMO_BACKEND=INDUCTOR": "voxrelay does not torch.compile the model"}


def test_fsdp_settings_are_not_reported_for_a_run_the_voxrelay_config_makes_ddp(seed_env, caplog, monkeypatch):
    """A user's walk: with `train.strategy=ddp` the summary still said `checkpoints are sharded (DCP)` and named
    FSDP_CPU_RAM_EFFICIENT_LOADING as not applied, for a run that shards nothing."""
    monkeypatch.delenv("RANK", raising=False)
    with caplog.at_level(logging.INFO, logger="voxrelay.train.launch_env"):
        cfg = apply_accelerate_env(load_config(None, ["train.strategy=ddp"]), dict(seed_env))
    assert (cfg.train.strategy, cfg.train.precision) == ("ddp", "bf16")
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "the voxrelay config's own keys win: train.strategy=ddp" in said
    assert "FSDP_" not in said and "DCP" not in said and [r.levelname for r in caplog.records] == ["INFO"], said
