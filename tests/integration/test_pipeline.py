"""prepare -> train -> synthesize -> export through the CLI, on a local root, with the example
config that the docs' stage-by-stage commands use."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from typer.testing import CliRunner

from tests.helpers.tiny import tiny as tiny_args
from voxrelay.cli import app, demo_config_path

runner = CliRunner()
REPO = Path(__file__).parents[2]
EXAMPLE = REPO / "examples" / "demo.yaml"


def invoke(*args: str):
    result = runner.invoke(app, [str(a) for a in args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result


# the demo's model layout: two frames per position, audio inputs from the codec's centroids
DEMO_MODEL = ("model.frames_per_position=2", "model.text_position_scale=0.875", "model.audio_embedding=codec")


@pytest.mark.parametrize("model_args", [(), DEMO_MODEL], ids=["one-code-per-position", "demo-layout"])
def test_prepare_train_synthesize_export(tmp_path, model_args):
    root = tmp_path / "bucket"
    cfg = EXAMPLE

    def tiny(root: str, *extra: str) -> list[str]:
        return tiny_args(root, *model_args, *extra)

    invoke("prepare", cfg, *tiny(str(root)))
    index = json.loads((root / "prepared/demo/index.json").read_text())
    assert index["counts"]["train"] > 0 and index["counts"]["eval"] == 3
    assert index["codec"]["type"] == "mel_kmeans" and index["num_codebooks"] == 2
    assert set(index["speakers"]) == {"en-us", "en-gb+f3"}

    invoke("train", cfg, *tiny(str(root)))
    run = root / "runs/demo"
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    losses = [m["loss"] for m in lines if "loss" in m]
    mcds = [m["eval/mcd_dtw"] for m in lines if "eval/mcd_dtw" in m]
    assert len(losses) >= 3 and all(np.isfinite(losses))
    waits = [m["data_wait"] for m in lines if "tokens_per_sec" in m]  # every throughput report has it
    assert waits and all(0 <= w <= 1 for w in waits)
    assert all(m["staging_backlog"] >= 0 and m["staging_free_gb"] > 0 for m in lines if "tokens_per_sec" in m)
    assert [m["step"] for m in lines if "eval/mcd_dtw" in m] == [0, 3, 6] and all(np.isfinite(mcds))
    assert any(p.name.startswith("events.out.tfevents") for p in (run / "tensorboard").iterdir())
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-00000004", "step-00000006"]
    assert (run / "config.yaml").exists()
    assert (("model:\n" in (run / "config.yaml").read_text())
            and ("frames_per_position: 2" in (run / "config.yaml").read_text()) == bool(model_args))

    out = tmp_path / "hello.wav"
    res = invoke("synthesize", run, "hello there", "-o", out, "--voice", "en-gb+f3")
    assert res.output.strip().splitlines()[-1] == str(out)
    wav, sr = sf.read(out)
    assert sr == 16000 and len(wav) > 0 and np.isfinite(wav).all()

    invoke("export", run, "-o", tmp_path / "export")
    from transformers import LlamaForCausalLM

    assert LlamaForCausalLM.from_pretrained(tmp_path / "export").config.num_hidden_layers == 1
    out2 = tmp_path / "again.wav"
    invoke("synthesize", tmp_path / "export", "hello there", "-o", out2, "--voice", "en-gb+f3")
    wav2, _ = sf.read(out2)
    assert np.array_equal(wav, wav2)  # same weights, same seed -> same audio

    status = invoke("status", run).output
    assert "steps        6 of 6" in status and "durable      step 6" in status and "finished     yes" in status

    # a second `train` with a higher max_steps resumes instead of starting over
    res = invoke("train", cfg, *tiny(str(root), "train.max_steps=8"))
    steps = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps[-1] == 8 and steps.count(0) == 1


def test_config_show_prints_resolved_config():
    res = invoke("config", "show", demo_config_path(), "train.max_steps=11", "root=/tmp/x")
    assert "max_steps: 11" in res.output and "root: /tmp/x" in res.output


# a commented-out setting in the example: "  # key: value" (a list item or a note does not match)
OPTION = re.compile(r"^(\s+)# ([a-z_]+: \S.*)$")


def test_example_config_is_the_embedded_demo_explained(tmp_path):
    """examples/demo.yaml is a file of its own (not a link to the embedded demo) that resolves to
    the same config as the embedded demo `voxrelay demo` runs; each group of commented-out settings
    in it (consecutive lines), uncommented, is a valid config that changes what it says."""
    from voxrelay.config import load_config

    assert not EXAMPLE.is_symlink() and EXAMPLE.resolve() != demo_config_path().resolve()
    base = load_config(EXAMPLE).to_dict()
    assert base == load_config(demo_config_path()).to_dict()
    lines = EXAMPLE.read_text().splitlines()
    groups: list[list[int]] = []
    for i, line in enumerate(lines):
        if OPTION.match(line):
            if groups and groups[-1][-1] == i - 1:
                groups[-1].append(i)
            else:
                groups.append([i])
    assert len(groups) >= 5, "the example shows alternatives for the settings users change"
    for group in groups:
        edited = list(lines)
        for i in group:
            edited[i] = OPTION.sub(r"\1\2", lines[i])
        path = tmp_path / "edited.yaml"
        path.write_text("\n".join(edited) + "\n")
        changed = load_config(path).to_dict()  # a key that does not exist (any more) is an error
        assert changed != base, [lines[i] for i in group]


def test_the_docs_name_example_files_that_exist():
    pages = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    named = set(re.findall(r"examples/[\w./-]+\.ya?ml", "\n".join(p.read_text() for p in pages)))
    assert "examples/demo.yaml" in named
    assert [p for p in sorted(named) if not (REPO / p).is_file()] == []
