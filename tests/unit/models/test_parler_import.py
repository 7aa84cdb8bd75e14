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


def _import(src: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "voxrelay", "import", "parler-config", str(src), "-o", str(out),
                           *extra], capture_output=True, text=True, timeout=120, env=dict(os.environ, COLUMNS="200"))


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
    # upstream encodes with the model's own DAC (model_name_or_path's audio_encoder), not feature_extractor_name's
    model_dir = "gs://my-gcs-bucket1/parler-tts/parler-tts-untrained-600M/parler-tts-untrained-600M"
    assert (cfg.codec.type, cfg.codec.path, cfg.codec.batch_size) == ("dac", model_dir, 8)
    assert cfg.data.name == "tmp_dataset_audio"  # save_to_disk: where upstream keeps the encoded dataset
    t = cfg.train
    assert (t.lr, t.grad_accum, t.precision, t.schedule, t.warmup_steps, t.seed) == (
        0.00095, 8, "bf16", "constant_with_warmup", 20000, 456)
    assert list(t.betas) == [0.9, 0.99] and t.batch_tokens > 3 * 30 * 86
    assert (cfg.checkpoint.every_steps, cfg.checkpoint.keep_last, cfg.monitor.wandb) == (10000, 10, True)
    notes = " ".join(res.stderr.split())
    for field in ("cache_dir", "temporary_save_to_disk", "feature_extractor_name", "eval_dataset_name",
                  "attn_implementation"):
        assert f"note: {field}: dropped (" in notes, field
    assert "unknown" not in notes
    assert "cache_dir: dropped (voxrelay keeps hub downloads in the bucket itself (cache.models_uri" in notes
    # 40 epochs of data not yet prepared: max_steps stays at its default, and the note says what to set
    assert t.max_steps == 300
    assert ("num_train_epochs=40: train.max_steps left at 300; set it to 40 x the prepared training data's tokens / "
            "(train.batch_tokens x train.grad_accum x GPUs)") in notes
    assert ("import this file again with --prepared gs://my-gcs-bucket1/parler-tts/prepared/tmp_dataset_audio") in notes
    for key, field in (("train.eps", "adam_epsilon"), ("train.clip_norm", "max_grad_norm")):
        assert f"note: {key}: left at voxrelay's default" in notes and f"({field} is not in the file" in notes, key


def test_epochs_become_steps_from_the_prepared_datas_size(tmp_path):
    """Upstream: steps = epochs x (rows // (batch x accumulation x GPUs)). voxrelay batches by tokens: 40 epochs of
    the prepared train split (8,000 s, 1,000 rows) at 3 x (30 s x 86 + 49) tokens x 8 = 12 steps an epoch."""
    from voxrelay.config import load_config

    prepared = tmp_path / "prepared" / "tmp_dataset_audio"
    prepared.mkdir(parents=True)
    shards = [{"name": "train-00000", "split": "train", "rows": 600, "seconds": 5000.0},
              {"name": "train-00001", "split": "train", "rows": 400, "seconds": 3000.0},
              {"name": "eval-00000", "split": "eval", "rows": 96, "seconds": 900.0}]
    (prepared / "index.json").write_text(json.dumps({"counts": {"train": 1000, "eval": 96}, "shards": shards}))
    res = _import(SEED, tmp_path / "parler.yaml", "--prepared", str(prepared))
    assert res.returncode == 0, res.stderr
    assert load_config(str(tmp_path / "parler.yaml"), []).train.max_steps == 40 * 12
    assert "num_train_epochs=40 -> train.max_steps=480" in " ".join(res.stderr.split())


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
