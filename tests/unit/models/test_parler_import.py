"""`voxrelay import parler-config`: seed 000's own training JSON (upstream's starting_point_0.01.json edited for
Colab + a gcsfuse-mounted bucket) becomes a voxrelay config that validates; every dropped field is named with
its reason, unknown fields are listed; a bad file exits 2. ``model.init_from`` may be a bucket folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

FIXTURES = Path(__file__).parents[2] / "fixtures" / "parler"
SEED = FIXTURES / "seed000_starting_point_0.01_colab.json"


def _import(src: Path, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "voxrelay", "import", "parler-config", str(src), "-o", str(out)],
                          capture_output=True, text=True, timeout=120, env=dict(os.environ, COLUMNS="200"))


def test_seed_000s_training_json_becomes_a_config(tmp_path):
    from voxrelay.config import load_config

    res = _import(SEED, tmp_path / "parler.yaml")
    assert res.returncode == 0, res.stderr
    cfg = load_config(str(tmp_path / "parler.yaml"), [])
    assert (cfg.root, cfg.name) == ("gs://my-gcs-bucket1/parler-tts", "output_dir_training")  # the mount is a bucket
    assert cfg.model.family == "parler" and cfg.model.freeze_text_encoder and cfg.model.max_prompt_tokens == 400
    assert cfg.model.init_from == "gs://my-gcs-bucket1/parler-tts/output_dir_training/checkpoint-200000-epoch-1"
    srcs = cfg.data.sources
    assert [(s.hub_id, s.hub_config, s.split) for s in srcs] == [
        ("blabble-io/libritts_r", "clean", "train.clean.360"), ("blabble-io/libritts_r", "clean", "train.clean.100"),
        ("blabble-io/libritts_r", "other", "train.other.500"), ("parler-tts/mls_eng_10k", "default", "train")]
    assert srcs[3].metadata_hub_id == "parler-tts/mls-eng-10k-tags_tagged_10k_generated"
    assert {s.description_column for s in srcs} == {"text_description"}
    assert (cfg.data.min_duration, cfg.data.max_duration, cfg.data.eval_size) == (2.0, 30, 96)
    assert (cfg.codec.type, cfg.codec.path, cfg.codec.batch_size) == ("dac", "ylacombe/dac_44khZ_8kbps", 8)
    t = cfg.train
    assert (t.lr, t.grad_accum, t.precision, t.schedule, t.warmup_steps, t.seed) == (
        0.00095, 8, "bf16", "constant_with_warmup", 20000, 456)
    assert list(t.betas) == [0.9, 0.99] and t.batch_tokens > 3 * 30 * 86
    assert (cfg.checkpoint.every_steps, cfg.checkpoint.keep_last, cfg.monitor.wandb) == (10000, 10, True)
    notes = " ".join(res.stderr.split())
    for field in ("cache_dir", "save_to_disk", "num_train_epochs", "eval_dataset_name", "attn_implementation"):
        assert f"note: {field}: dropped (" in notes, field
    assert "unknown" not in notes


def test_unknown_fields_are_listed_and_a_bad_file_exits_2(tmp_path):
    args = json.loads(SEED.read_text()) | {"push_to_hub_freq": 3}
    (tmp_path / "x.json").write_text(json.dumps(args))
    res = _import(tmp_path / "x.json", tmp_path / "x.yaml")
    assert res.returncode == 0 and "push_to_hub_freq: unknown to this importer" in " ".join(res.stderr.split())
    (tmp_path / "bad.json").write_text("{not json")
    bad = _import(tmp_path / "bad.json", tmp_path / "bad.yaml")
    assert bad.returncode == 2 and "cannot read it as JSON" in bad.stderr and "Traceback" not in bad.stderr
    assert not (tmp_path / "bad.yaml").exists()
    other = _import(SEED, tmp_path / "o.yaml").returncode, subprocess.run(
        [sys.executable, "-m", "voxrelay", "import", "orpheus-config", str(SEED), "-o", str(tmp_path / "o2.yaml")],
        capture_output=True, text=True, timeout=120)
    assert other[0] == 0 and other[1].returncode == 2 and "known: parler-config" in other[1].stderr


def test_init_from_an_upstream_checkpoint_in_a_bucket(tmp_path, monkeypatch, memory_root):
    """As seed 000 resumes from `.../output_dir_training/checkpoint-*` in its bucket: the folder is fetched into
    the local cache once, then loaded through the key map."""
    from safetensors.torch import load_file

    from tests.helpers.parler import save_t5_tokenizer
    from voxrelay import storage
    from voxrelay.config import load_config
    from voxrelay.models.base import DataSpec
    from voxrelay.models.registry import build_model

    monkeypatch.setenv("VOXRELAY_CACHE", str(tmp_path / "cache"))
    ckpt = storage.join(memory_root, "output_dir_training", "checkpoint-200-epoch-0")
    for name in ("config.json", "model.safetensors"):
        storage.put_file(FIXTURES / name, storage.join(ckpt, name))
    tok = save_t5_tokenizer(tmp_path / "tok")
    cfg = load_config(None, ["model.family=parler", f"model.init_from={ckpt}", f"model.description_tokenizer={tok}",
                             f"model.prompt_tokenizer={tok}"]).model
    model = build_model(cfg, DataSpec(9, 1024), seed=0)
    saved = load_file(str(FIXTURES / "model.safetensors"))
    assert all(model.module.state_dict()[k].equal(v) for k, v in saved.items())
