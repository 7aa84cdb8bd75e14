"""What users of VibeVoice already hold, prepared as it is: seed 003's folder (its metadata.csv layout with
absolute paths, its one-line ``[SPEAKER_A] ... [SPEAKER_B] ...`` transcripts, transcribed in
tests/fixtures/vibevoice/seed003) and the community fine-tuning repository's JSONL (``Speaker N:`` text and a
``voice_prompts`` column, its README's examples verbatim in tests/fixtures/vibevoice/community); voice
prompts carried from a ``voice_prompts`` column into the prepared rows and the examples."""

from __future__ import annotations

import json
import logging
import shutil

from tests.helpers.datasets import make_wav
from tests.helpers.vibevoice_data import FIXTURES, community_jsonl, prepare_for_vibevoice, seed_003_corpus


def test_seed_003s_folder_with_one_line_dialogues_prepares_every_row(tmp_path, monkeypatch, caplog):
    corpus = seed_003_corpus(tmp_path)
    assert str(corpus) in (corpus / "metadata.csv").read_text()  # absolute paths, as the seed writes them
    with caplog.at_level(logging.WARNING):
        report, index, rows = prepare_for_vibevoice(tmp_path, monkeypatch, f"{{type: folder, path: {corpus}}}")
    # the seed's layout has no way to a voice prompt: said at prepare, before a GPU is rented for train
    assert "will train without voice prompts" in caplog.text and "`voice_prompts` column" in caplog.text
    assert report.rejects == [] and index["counts"] == {"train": 2, "eval": 0, "rejected": 0}
    seed_line = (corpus / "text" / "d001.txt").read_text(encoding="utf-8").strip()
    assert rows["d001"].text == seed_line and rows["d001"].codes.shape == (1, int(1.2 * 24000))


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
    report, index, rows = prepare_for_vibevoice(tmp_path, monkeypatch, f"{{type: folder, path: {corpus}}}",
                                                "data.max_reject_fraction=1.0")  # 1 of the 2 rows is bad on purpose
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
