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
