"""What users of VibeVoice already hold, prepared as it is: seed 003's folder (its metadata.csv layout with
absolute paths, its one-line ``[SPEAKER_A] ... [SPEAKER_B] ...`` transcripts, transcribed in
tests/fixtures/vibevoice/seed003) and the community fine-tuning repository's JSONL (``Speaker N:`` text and a
``voice_prompts`` column, its README's examples verbatim in tests/fixtures/vibevoice/community); voice
prompts carried from a ``voice_prompts`` column into the prepared rows and the examples."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tests.helpers.datasets import make_wav

FIXTURES = Path(__file__).parents[2] / "fixtures" / "vibevoice"
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


def test_seed_003s_folder_with_one_line_dialogues_prepares_every_row(tmp_path, monkeypatch):
    corpus = seed_003_corpus(tmp_path)
    assert str(corpus) in (corpus / "metadata.csv").read_text()  # absolute paths, as the seed writes them
    report, index, rows = prepare_for_vibevoice(tmp_path, monkeypatch, f"{{type: folder, path: {corpus}}}")
    assert report.rejects == [] and index["counts"] == {"train": 2, "eval": 0, "rejected": 0}
    seed_line = (corpus / "text" / "d001.txt").read_text(encoding="utf-8").strip()
    assert rows["d001"].text == seed_line and rows["d001"].codes.shape == (1, int(1.2 * 24000))


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


def test_the_community_jsonl_layout_prepares_with_its_voice_prompts(tmp_path, monkeypatch):
    """--train_jsonl prompts.jsonl of voicepowered-ai/VibeVoice-finetuning: `Speaker N:` text, `audio`, and
    `voice_prompts` absent, one path, or a list of paths in the order of the speakers."""
    report, index, rows = prepare_for_vibevoice(tmp_path, monkeypatch,
                                                f"{{type: jsonl, path: {community_jsonl(tmp_path)}}}")
    assert report.rejects == [] and index["counts"]["train"] == 3
    assert index["identity"]["params"]["data.voice_prompts"] is True
    no_prompt, one, dialogue = rows["prompts-1"], rows["prompts-2"], rows["prompts-3"]
    assert no_prompt.voice_prompts == () and dialogue.text.startswith("Speaker 0: How is the project")
    assert [p.shape for p in one.voice_prompts] == [(1, 12000)]  # 0.5 s at 22.05 kHz, resampled to 24 kHz
    assert [p.shape for p in dialogue.voice_prompts] == [(1, 12000), (1, 24000)]  # alice's, then bob's


def test_a_voice_prompts_column_in_seed_003s_metadata_is_kept_per_row(tmp_path, monkeypatch):
    """Seed 003's metadata has no speaker column: a `voice_prompts` column (one clip per speaker in tag order,
    `;`-separated, relative or absolute paths inside the folder) gives its dialogues their prompts; a row whose
    clips do not match its speakers is rejected naming the fix."""
    corpus = tmp_path / "vocal_corpus"
    make_wav(corpus / "prompts" / "a.wav", 0.5, 24000, freq=500.0)
    make_wav(corpus / "prompts" / "b.wav", 0.75, 24000, freq=700.0)
    seed_003_corpus(tmp_path, {"d001": "prompts/a.wav;prompts/b.wav", "d002": f"{corpus}/prompts/b.wav"})
    report, index, rows = prepare_for_vibevoice(tmp_path, monkeypatch, f"{{type: folder, path: {corpus}}}")
    assert [p.shape[1] for p in rows["d001"].voice_prompts] == [12000, 18000]
    assert [r["id"] for r in report.rejects] == ["d002"]
    assert "voice_prompts names 1 clip(s) but the transcript has 2 speaker(s)" in report.rejects[0]["reason"]


def test_a_hf_dataset_with_a_list_of_audio_voice_prompts(tmp_path, monkeypatch):
    """The community trainer's `--dataset_name` route: a datasets Dataset with `text`, an Audio `audio` column and
    `voice_prompts` as a list of Audio (embedded by save_to_disk), read without decoding through torchcodec."""
    import datasets

    clips = tmp_path / "clips"
    for name, seconds in (("convo", 1.5), ("alice", 0.5), ("bob", 1.0)):
        make_wav(clips / f"{name}.wav", seconds, 24000)
    rows = json.loads((FIXTURES / "community" / "prompts.jsonl").read_text().splitlines()[2])
    ds = datasets.Dataset.from_dict({"text": [rows["text"]], "audio": [str(clips / "convo.wav")],
                                     "voice_prompts": [[str(clips / "alice.wav"), str(clips / "bob.wav")]]})
    ds = ds.cast_column("audio", datasets.Audio()).cast_column("voice_prompts", datasets.List(datasets.Audio()))
    ds.save_to_disk(str(tmp_path / "hf"))
    shutil.rmtree(clips)  # the clips live in the saved dataset now
    report, _, prepared = prepare_for_vibevoice(tmp_path, monkeypatch, f"{{type: hf, path: {tmp_path / 'hf'}}}")
    assert report.rejects == [] and [p.shape for p in prepared["train-0"].voice_prompts] == [(1, 12000), (1, 24000)]
