"""Users' VibeVoice data in a temporary folder, from the transcribed fixtures of tests/fixtures/vibevoice (seed
003's folder, the community fine-tuning repository's JSONL) with short generated audio, and ``prepare`` of it
in process with the VibeVoice family's data needs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tests.helpers.datasets import make_wav

FIXTURES = Path(__file__).parents[1] / "fixtures" / "vibevoice"
SEED_ROOT = "/mnt/data_disk/vocal_corpus"  # where seed 003 keeps its corpus; the copy's paths are rewritten


def seed_003_corpus(tmp_path: Path, voice_prompts: dict[str, str] | None = None) -> Path:
    """The seed 003 fixture in ``tmp_path/vocal_corpus`` with its absolute paths pointing there and short
    24 kHz 16-bit mono dialogues (``voice_prompts``: id -> a cell of a ``voice_prompts`` column added)."""
    folder = tmp_path / "vocal_corpus"
    shutil.copytree(FIXTURES / "seed003", folder, dirs_exist_ok=True)
    lines = (folder / "metadata.csv").read_text(encoding="utf-8").replace(SEED_ROOT, str(folder)).splitlines()
    if voice_prompts is not None:
        lines = [lines[0] + ",voice_prompts"] + [f"{line},{voice_prompts.get(line.split(',')[0], '')}"
                                                 for line in lines[1:]]
    (folder / "metadata.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    for i, row in enumerate(lines[1:]):
        make_wav(folder / "audio" / f"{row.split(',')[0]}.wav", 1.2 + 0.2 * i, 24000, freq=180.0 + 60 * i)
    return folder


def prepare_for_vibevoice(tmp_path: Path, monkeypatch, source: str, *overrides: str):
    """``voxrelay prepare`` in process, with the VibeVoice family's data needs; (report, index, rows by id)."""
    from voxrelay.config import load_config
    from voxrelay.data.loader import PreparedDataset
    from voxrelay.data.prepare import prepare

    monkeypatch.setenv("VOXRELAY_CACHE", str(tmp_path / "cache"))
    cfg = load_config(None, [f"root={tmp_path / 'root'}", f"data.sources=[{source}]", "data.eval_size=0",
                             "codec.type=pcm", "codec.sample_rate=24000", "model.family=vibevoice",
                             f"model.init_from={tmp_path / 'not-needed-to-prepare'}", *overrides])
    report = prepare(cfg)
    index = json.loads((tmp_path / "root" / "prepared" / cfg.data.name / "index.json").read_text())
    rows = {r.id: r for r in PreparedDataset.open(cfg.prepared_uri, "train", index).rows}
    return report, index, rows


def community_jsonl(tmp_path: Path) -> Path:
    """The community repository's README examples (``prompts.jsonl``) with their absolute paths moved under
    ``tmp_path`` and short clips written there (the prompts at 22.05 kHz: prepare resamples them)."""
    text = (FIXTURES / "community" / "prompts.jsonl").read_text(encoding="utf-8").replace('"/', f'"{tmp_path}/')
    path = tmp_path / "prompts.jsonl"
    path.write_text(text, encoding="utf-8")
    for n, line in enumerate(text.splitlines()):
        row = json.loads(line)
        make_wav(row["audio"], 1.0 + 0.5 * n, 24000, freq=200.0 + 50 * n)
        prompts = row.get("voice_prompts") or []
        for i, prompt in enumerate([prompts] if isinstance(prompts, str) else prompts):
            make_wav(prompt, 0.5 + 0.5 * i, 22050, freq=300.0 + 100 * i)
    return path
