"""examples/orpheus-colab-t4.yaml (issue 34 item 8): Orpheus-3B LoRA on a free Colab T4, planned from a folder
holding only Llama-3.2-3B's config.json with Orpheus' 156,940-entry vocabulary (no weights, no hub). It must fit
the T4 under 10 GB, the Colab runtime's 12.7 GB of host RAM, in fp16 (no bf16 on a T4); QLoRA 4-bit near 6 GB;
8,192 tokens on an L4 (24 GB)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from voxrelay.cli import app

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "orpheus-colab-t4.yaml"
LLAMA_3B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 3072,
            "intermediate_size": 8192, "num_attention_heads": 24, "num_key_value_heads": 8, "num_hidden_layers": 28,
            "vocab_size": 156940, "max_position_embeddings": 131072, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
            "tie_word_embeddings": True, "head_dim": 128, "hidden_act": "silu", "bos_token_id": 128000,
            "eos_token_id": 128009}


def _plan(tmp_path: Path, gpu: str, tokens: int) -> tuple[list[dict], str]:
    folder = tmp_path / "orpheus-3b"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(LLAMA_3B))
    args = ["plan", str(EXAMPLE), f"root={tmp_path}", f"model.init_from={folder}", "--gpu", gpu, "--seq-len",
            str(tokens)]
    res = CliRunner().invoke(app, [*args, "--json"], env={"HF_HUB_OFFLINE": "1"})
    assert res.exit_code == 0, res.output
    text = CliRunner().invoke(app, args, env={"HF_HUB_OFFLINE": "1", "COLUMNS": "200"}).output
    return json.loads(res.output), text


def test_the_t4_example_fits_a_free_colab_in_fp16(tmp_path: Path) -> None:
    rows, text = _plan(tmp_path, "colab-t4", 2048)
    mine = next(r for r in rows if r["lora"] and r["gradient_checkpointing"] and r["activation_offload"]
                and not r["base_bits"])
    assert mine["fits"] and mine["host_fits"] and mine["per_gpu_bytes"]["total"] <= 10e9, mine
    assert mine["per_gpu_bytes"]["logits"] < 0.3e9  # a chunk of the 156,940-way logits, not all (3.9 GB)
    qlora = next(r for r in rows if r["base_bits"] == 4)
    assert qlora["per_gpu_bytes"]["total"] <= 6.05e9, qlora  # 6.02 GB: the layers' phase (see README)
    assert "fp16 with a loss scaler" in text and "this config (ddpx1 lora grad-ckpt act-offload adamw)" in text
    assert "fits" in text.split("this config", 1)[1].split("\n", 1)[0]


def test_the_t4_example_at_8k_tokens_fits_an_l4(tmp_path: Path) -> None:
    rows, _ = _plan(tmp_path, "l4", 8192)
    mine = next(r for r in rows if r["lora"] and r["gradient_checkpointing"] and r["activation_offload"]
                and not r["base_bits"])
    assert mine["fits"] and mine["per_gpu_bytes"]["total"] <= 24e9, mine
