"""``voxrelay prepare --check-codec``: a sample of the sources' clips round-tripped through codec.*, scored by MCD-DTW
and Whisper (recordings vs round trips), the round trips written to listen to; nothing prepared."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import soundfile as sf

from tests.helpers.runner import env_for, voxrelay
from voxrelay.cli import demo_config_path

pytestmark = pytest.mark.slow  # tiers: see tests/conftest.py

SOURCES = "data.sources=[{type: demo, minutes: 2, seed: 3, voices: [en-us]}]"


def check(tmp: Path, *extra: str):
    res = voxrelay("prepare", str(demo_config_path()), f"root={tmp / 'root'}", SOURCES, "--check-codec", "--clips",
                   "3", *extra, env=env_for(tmp / "cache"))
    assert res.returncode == 0, res.stdout + res.stderr
    folder = tmp / "root/prepared/demo/codec_check"
    return res, json.loads((folder / "report.json").read_text()), folder


def test_check_codec_scores_round_trips_and_a_coarser_codec_scores_worse(tmp_path: Path) -> None:
    res, fine, folder = check(tmp_path / "fine", "codec.codebook_size=256")
    assert not (tmp_path / "fine/root/prepared/demo/index.json").exists()  # nothing prepared
    assert fine["summary"]["clips"] == 3 and len(fine["clips"]) == 3
    assert {"recording_wer", "round_trip_wer", "recording_cer", "round_trip_cer"} <= set(fine["summary"])
    assert all(c["recording_transcript"] and c["round_trip_transcript"] for c in fine["clips"]), fine["clips"]
    for clip in fine["clips"]:
        wav, rate = sf.read(folder / f"{clip['id']}.wav")
        assert rate == 16000 and abs(len(wav) / rate - clip["seconds"]) < 0.05
    assert "mean MCD-DTW" in res.stdout and "on the round trips" in res.stdout
    _, coarse, _ = check(tmp_path / "coarse", "codec.codebook_size=4", "eval.asr=null")
    assert [c["id"] for c in coarse["clips"]] == [c["id"] for c in fine["clips"]]  # the same clips each time
    assert coarse["summary"]["mcd_db"] > fine["summary"]["mcd_db"] + 1.0, (coarse["summary"], fine["summary"])
    assert "recording_wer" not in coarse["summary"]


def test_check_text_lists_a_new_languages_characters_and_the_setting_that_adds_them(tmp_path: Path) -> None:
    import csv

    import numpy as np
    import yaml

    from tests.helpers.orpheus import save_llama3_tokenizer

    corpus = tmp_path / "corpus"
    (corpus / "audio").mkdir(parents=True)
    with open(corpus / "metadata.csv", "w", newline="") as f:
        rows = csv.writer(f)
        rows.writerow(["id", "audio_path", "text"])
        for i, text in enumerate(["Zażółć gęślą jaźń.", "Dzień dobry, miło cię widzieć."]):
            sf.write(corpus / f"audio/u{i}.wav", np.zeros(16000, dtype=np.float32), 16000)
            rows.writerow([f"u{i}", f"audio/u{i}.wav", text])
    config = tmp_path / "run.yaml"
    tok = str(save_llama3_tokenizer(tmp_path / "t"))
    config.write_text(yaml.safe_dump({
        "name": "pl", "root": str(tmp_path / "root"), "data": {"name": "pl", "sources": [
            {"type": "folder", "path": str(corpus)}]}, "codec": {"type": "snac", "path": "unused/because-no-encode"},
        "model": {"family": "causal_lm", "layout": "orpheus", "tokenizer": tok}}))
    env = env_for(tmp_path / "cache")
    res = voxrelay("prepare", str(config), "--check-text", env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    suggestion = res.stdout.strip().splitlines()[-1]
    assert "'ź'" in res.stdout and "cannot be added" in res.stdout and "model.add_tokens=[" in suggestion
    setting = suggestion.split("'")[-2]  # the override as printed, quotes and all
    res = voxrelay("prepare", str(config), "--check-text", setting, env=env)
    assert res.returncode == 0 and "'ź'" not in res.stdout and "model.add_tokens" not in res.stdout, res.stdout
    assert not (tmp_path / "root/prepared").exists()  # nothing prepared
    res = voxrelay("prepare", str(config), "--check-text", "model.add_tokens=[ł]", env=env)
    assert res.returncode == 2 and "cannot be added" in res.stderr and "Traceback" not in res.stderr
