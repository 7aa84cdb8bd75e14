"""Pretrained models cached in the bucket (``cache.models_uri``, on the S3 and GCS test servers): a first
session that got a model from the hub uploads it; a second session on another machine (an empty local cache)
with the hub cut off (``HF_HUB_OFFLINE=1``) loads it by its hub id, equal weights, and nothing lands in
``~/.cache/huggingface``."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # tiers: see tests/conftest.py

REPO = "voxrelay-test/tiny-lm"
SESSION = """
import logging
import sys
logging.basicConfig(level=logging.INFO)
from voxrelay.config import load_config
from voxrelay.models import hub_cache
hub_cache.use_local_hub_cache()
cfg = load_config(None, [f"root={sys.argv[1]}"])
if sys.argv[2] == "first":
    hub_cache.to_bucket(cfg)
else:
    hub_cache.from_bucket(cfg)
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(sys.argv[3])
    print("sum", float(sum(p.double().sum() for p in model.parameters())))
"""


def _downloaded(hub: Path) -> float:
    """A tiny Llama as the hub client leaves it in its cache: blobs, a snapshot of symlinks, refs/main."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2))
    tmp = hub / "tmp"
    model.save_pretrained(tmp)
    repo = hub / ("models--" + REPO.replace("/", "--"))
    commit = "0123456789abcdef0123456789abcdef01234567"
    for f in tmp.iterdir():
        blob = repo / "blobs" / hashlib.sha256(f.read_bytes()).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        f.rename(blob)
        link = repo / "snapshots" / commit / f.name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    tmp.rmdir()
    return float(sum(p.detach().double().sum() for p in model.parameters()))


def _session(root: str, which: str, cache: Path, home: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env |= {"VOXRELAY_CACHE": str(cache), "HOME": str(home), "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-c", SESSION, root, which, REPO], env=env, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.parametrize("backend", ["s3", "gcs"])
def test_a_model_from_the_hub_is_cached_in_the_bucket_for_the_next_session(tmp_path, backend, request):
    root = request.getfixturevalue(f"{backend}_root")
    expected = _downloaded(tmp_path / "machine-1" / "hf-hub")
    first = _session(root, "first", tmp_path / "machine-1", tmp_path / "home")
    assert first.returncode == 0, first.stderr
    assert f"pretrained {REPO}@01234567: 3 files cached in" in first.stderr, first.stderr  # config x2, weights
    second = _session(root, "second", tmp_path / "machine-2", tmp_path / "home")
    assert second.returncode == 0, second.stderr
    assert "files copied from" in second.stderr, second.stderr
    assert float(second.stdout.split("sum")[1]) == pytest.approx(expected, rel=1e-9)
    assert not (tmp_path / "home" / ".cache" / "huggingface").exists()  # nothing on the home disk
    # the hub cut off and no bucket copy: the second machine cannot load it (the test can fail)
    third = _session(f"{root}-empty", "second", tmp_path / "machine-3", tmp_path / "home")
    assert third.returncode != 0
