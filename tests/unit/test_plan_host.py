"""``voxrelay plan`` prices the host too (issue 34 item 7): host RAM per process and per machine, held against
the machine's RAM, and never a recommendation the host cannot hold (FSDP offload of a 3B model on a free Colab)."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from voxrelay.cli import app
from voxrelay.config import load_config
from voxrelay.plan import Lengths, ModelFacts, Strategy, host_memory_of, make_plan
from voxrelay.plan.fit import next_best
from voxrelay.plan.formulas import GB, Param, Shape
from voxrelay.plan.host import BATCH_BYTES_PER_TOKEN, CUDA_HOST, PROCESS_CPU, host_bytes

GIB = 2**30
BIG = (8192, 8192)  # 67.1M parameters: 268 MB in fp32


def _facts(matrices: int) -> ModelFacts:
    params = [Param(BIG, 4, True, True) for _ in range(matrices)] + [Param((8192,), 4, True)]
    shape = Shape(1024, 2048, 8, 256, 128, 4, 1000)
    unit = (BIG[0] * BIG[1], BIG[0] * BIG[1])
    return ModelFacts({False: params, True: params}, {False: shape, True: shape}, {False: unit, True: unit}, 1000)


def test_host_bytes_worked_by_hand():
    """DDP: the whole model while it loads; FSDP offload over 2 GPUs: each rank's half of fp32 weights, gradients
    and AdamW's two states, plus the CPU step's two temporaries of its largest shard; per machine: both ranks."""
    cfg = load_config(None, ["cache.ram_gb=1.5", "train.prefetch_batches=2"])
    facts, n = _facts(10), 10 * BIG[0] * BIG[1] + 8192
    data = int(1.5 * GIB) + 3 * 1000 * BATCH_BYTES_PER_TOKEN
    ddp = host_bytes(cfg, facts, Strategy("ddp", 1, False, "adamw"), 1000)
    assert ddp["model"] == 4 * n and ddp["total"] == PROCESS_CPU + CUDA_HOST + 4 * n + data
    off = host_bytes(cfg, facts, Strategy("fsdp", 2, False, "adamw", cpu_offload=True, gradient_checkpointing=True),
                     1000)
    half = n // 2  # every tensor's dim 0 splits evenly in two here
    # weights + gradients + exp_avg + exp_avg_sq (4 bytes each), AdamW's float32 step per tensor (11 of them),
    # the CPU step's two temporaries of the largest shard (half a matrix)
    assert off["offload"] == 4 * half * 4 + 11 * 4 + 2 * 4 * (BIG[0] // 2) * BIG[1]
    assert off["model"] == max(4 * n, off["offload"]) and off["machine"] == 2 * off["total"]


def test_a_familys_feature_cache_is_counted():
    cfg = load_config(None, ["model.family=vibevoice", "model.feature_cache_gb=3"])
    without = load_config(None, ["model.family=vibevoice", "model.feature_cache_gb=0"])
    st = Strategy("ddp", 1, True, "adamw")
    assert host_bytes(cfg, _facts(1), st, 10)["total"] - host_bytes(without, _facts(1), st, 10)["total"] == 3 * GIB


def test_never_recommends_what_the_host_cannot_hold():
    """40 matrices (2.7B parameters, 43 GB of fp32 weights, gradients and Adam states): on a 16 GB card only FSDP's
    CPU offload fits the GPU; with a free Colab's 12.7 GB of RAM nothing is recommended, with 80 GB it is."""
    cfg, facts = load_config(None, []), _facts(40)
    colab = make_plan(cfg, facts, Lengths(512, "t"), 1, 15 * GB, bf16=False, host_memory=int(12.7 * GB))
    offload = next(r for r in colab.rows if r.strategy.cpu_offload)
    assert offload.fits and not offload.host_fits and offload.host_bytes["machine"] > 43 * GB
    assert colab.recommended() is None
    assert next_best(colab, Strategy("ddp", 1, False, "adamw")) is not offload
    roomy = make_plan(cfg, facts, Lengths(512, "t"), 1, 15 * GB, bf16=False, host_memory=80 * GB)
    assert roomy.recommended().strategy.cpu_offload


def test_host_memory_comes_from_the_option_the_colab_profile_or_this_machine():
    assert host_memory_of("64GiB", "colab-t4") == 64 * GIB
    assert host_memory_of(None, "colab-t4") == int(12.7 * GB)
    assert host_memory_of(None, "t4", this_machine=False) is None
    assert host_memory_of(None, None) > 0  # this machine's RAM


def test_plan_on_a_free_colab_t4_says_the_host_is_short(tmp_path: Path) -> None:
    """Orpheus-3B from a folder holding only its config.json, `--gpu colab-t4`: the T4 prices fp16 (no bf16), the
    offload row that fits the GPU needs ~60 GB of host RAM and is not recommended (it was, before the host was
    priced)."""
    from transformers import LlamaConfig

    LlamaConfig(hidden_size=3072, num_hidden_layers=28, num_attention_heads=24, num_key_value_heads=8,
                intermediate_size=8192, vocab_size=156_940, tie_word_embeddings=True).save_pretrained(tmp_path / "o")
    (tmp_path / "run.yaml").write_text(f"model: {{family: orpheus, init_from: {tmp_path / 'o'}}}\n"
                                       "codec: {type: snac, path: hubertsiuzdak/snac_24khz}\n")
    res = CliRunner().invoke(app, ["plan", str(tmp_path / "run.yaml"), f"root={tmp_path}", "--gpu", "colab-t4",
                                   "--seq-len", "2048"])
    assert res.exit_code == 0, res.output
    assert "host RAM: 12.7 GB per machine (free Colab, T4 runtime); precision auto: fp16 with a loss scaler" \
        in res.output
    assert "recommended: fsdp" not in res.output and "offload" not in res.output.split("this config")[1]


def test_max_tokens_is_capped_by_the_host_too():
    """The host's share grows with the micro-batch (the loader's batches, activation offload's layer inputs): the
    largest micro-batch a row takes is the smaller of the GPU's and the host's, worked by hand for the host."""
    cfg, facts = load_config(None, ["cache.ram_gb=1", "train.prefetch_batches=1"]), _facts(2)
    st = Strategy("ddp", 1, False, "adamw", gradient_checkpointing=True, activation_offload=True)
    host = 12 * GB
    row = next(r for r in make_plan(cfg, facts, Lengths(512, "t"), 1, 80 * GB, host_memory=host).rows
               if r.strategy == st)
    per_token = 2 * BATCH_BYTES_PER_TOKEN + 4 * 1024 * 4  # 2 batches held; 4 layers' fp32 inputs of width 1024
    fixed = PROCESS_CPU + CUDA_HOST + 4 * (2 * BIG[0] * BIG[1] + 8192) + GIB
    assert row.max_tokens == int((host - fixed) / per_token)
    gpu_only = next(r for r in make_plan(cfg, facts, Lengths(512, "t"), 1, 80 * GB).rows if r.strategy == st)
    assert gpu_only.max_tokens > row.max_tokens  # without a host to hold against, the GPU's bound alone


def test_the_table_marks_a_row_the_host_cannot_hold_in_plain_text():
    from rich.console import Console

    from voxrelay.plan.render import print_plan

    cfg, facts = load_config(None, []), _facts(40)
    plan = make_plan(cfg, facts, Lengths(512, "t"), 1, 15 * GB, bf16=False, host_memory=int(12.7 * GB))
    console = Console(width=250, color_system=None, record=True)
    print_plan(plan, console, Strategy("fsdp", 1, False, "adamw", cpu_offload=True, gradient_checkpointing=True))
    text = console.export_text()
    offload_line = next(line for line in text.splitlines() if "fsdp full gc offload" in line)
    assert " host " in offload_line and " yes " not in offload_line
    assert "fits the GPU, not the machine's RAM" in text
