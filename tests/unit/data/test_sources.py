import json
import os

import numpy as np
import pytest

from tests.helpers.datasets import (
    BAD_ROWS,
    EXPECTED_REASONS,
    GOOD_ROWS,
    MAX_DURATION,
    Row,
    make_folder_dataset,
    make_jsonl_dataset,
    make_ljspeech_dataset,
    make_wav,
)
from voxrelay.config import SourceConfig
from voxrelay.data.audio import load_utterance_audio
from voxrelay.data.sources import READERS, SourceError, SourceMissing, demo_folder, read_source
from voxrelay.data.types import RowError


def _read(tmp_path, **kw):
    return list(read_source(SourceConfig(**kw), tmp_path / "work"))


def _reasons(utts, max_duration: float = MAX_DURATION) -> dict[str, str | None]:
    """id -> reader problem, else the load_utterance_audio reason, else None (usable)."""
    out = {}
    for u in utts:
        out[u.id] = u.problem
        if u.problem is None:
            try:
                load_utterance_audio(u, 16000, 0.3, max_duration)
            except RowError as e:
                out[u.id] = str(e)
    return out


def test_readers_cover_every_source_type():
    assert set(READERS) == set(SourceConfig.model_fields["type"].annotation.__args__)


def test_folder_good_and_bad_rows(tmp_path):
    root = make_folder_dataset(tmp_path / "corpus")
    utts = _read(tmp_path, type="folder", path=str(root))
    assert [u.id for u in utts] == [r.id for r in GOOD_ROWS + BAD_ROWS]
    reasons = _reasons(utts)
    for row in GOOD_ROWS:
        assert reasons[row.id] is None, reasons[row.id]
    for bad_id, expected in EXPECTED_REASONS.items():
        assert reasons[bad_id] is not None and expected in reasons[bad_id], (bad_id, reasons[bad_id])
    first = utts[0]
    assert first.text == "[SPEAKER_A] Good morning.\n[SPEAKER_B] Morning to you."  # tags kept as is
    assert first.num_speakers == 2 and first.speaker is None
    assert first.where == f"{root / 'metadata.csv'} row 2"
    assert utts[5].where.endswith("metadata.csv row 7")


def test_folder_inline_text_and_absolute_path_inside(tmp_path):
    root = tmp_path / "c"
    inside = make_wav(root / "audio" / "abs.wav", 0.5)
    make_folder_dataset(root, [Row("a1", "Inline text, with a comma."), Row("a2", "Abs.", audio_path=str(inside))],
                        inline_text=True)  # fmt: skip
    utts = _read(tmp_path, type="folder", path=str(root))
    assert [(u.id, u.text, u.problem) for u in utts] == [
        ("a1", "Inline text, with a comma.", None),
        ("a2", "Abs.", None),
    ]
    assert utts[1].audio_path == str(inside.resolve())


def test_folder_symlink_escaping_is_rejected(tmp_path):
    outside = make_wav(tmp_path / "elsewhere" / "x.wav", 0.5)
    root = make_folder_dataset(tmp_path / "c", [Row("ok", "fine")])
    os.symlink(outside, root / "audio" / "link.wav")
    with open(root / "metadata.csv", "a") as f:
        f.write("lnk,audio/link.wav,text/ok.txt,1,0.5\n")
    utts = _read(tmp_path, type="folder", path=str(root))
    assert utts[0].problem is None
    assert "outside the dataset folder" in utts[1].problem


def test_folder_unquoted_comma_and_missing_fields(tmp_path):
    root = tmp_path / "c"
    make_wav(root / "a.wav", 0.5)
    (root / "metadata.csv").write_text("id,audio_path,text\nx1,a.wav,Hello, world\nx2,,Hi\nx3,a.wav\n")
    utts = _read(tmp_path, type="folder", path=str(root))
    assert "put double quotes around text" in utts[0].problem
    assert utts[1].problem == "missing field(s): audio_path"
    assert utts[2].problem == "missing field(s): text"


def test_folder_structural_errors(tmp_path):
    with pytest.raises(SourceMissing, match="nothing: not found; a folder source needs a folder with a metadata.csv"):
        _read(tmp_path, type="folder", path=str(tmp_path / "nothing"))
    (tmp_path / "nothing").mkdir()  # the folder is there, its metadata.csv is not
    with pytest.raises(SourceError, match="metadata.csv: not found"):
        _read(tmp_path, type="folder", path=str(tmp_path / "nothing"))
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "metadata.csv").write_text("d001,audio/d001.wav,text/d001.txt\n")
    with pytest.raises(SourceError, match="header 'd001,audio/d001.wav,text/d001.txt' is not recognised"):
        _read(tmp_path, type="folder", path=str(tmp_path / "c"))


def test_folder_accepts_bom(tmp_path):
    root = make_folder_dataset(tmp_path / "c", [Row("b1", "x")], inline_text=True)
    meta = root / "metadata.csv"
    meta.write_bytes(b"\xef\xbb\xbf" + meta.read_bytes())
    assert [u.id for u in _read(tmp_path, type="folder", path=str(root))] == ["b1"]


def test_ljspeech(tmp_path):
    root = make_ljspeech_dataset(tmp_path / "LJ", n=2)
    utts = _read(tmp_path, type="ljspeech", path=str(root))
    assert [u.id for u in utts] == ["LJ001-0000", "LJ001-0001", "LJ001-9999", "LJ001-8888"]
    assert utts[0].text == "Chapter 1, Doctor Smith."  # the normalised column
    assert utts[2].text == "Only raw text." and utts[2].problem is None
    assert utts[3].problem == "empty text"
    assert utts[0].audio_path.endswith("wavs/LJ001-0000.wav") and utts[0].where.endswith("metadata.csv row 1")
    assert _reasons(utts[:3]) == {u.id: None for u in utts[:3]}


def test_ljspeech_rejects_comma_csv(tmp_path):
    root = make_folder_dataset(tmp_path / "c", [Row("x", "y")])
    with pytest.raises(SourceError, match="use `type: folder`"):
        _read(tmp_path, type="ljspeech", path=str(root))


def test_jsonl(tmp_path):
    path = make_jsonl_dataset(tmp_path, n=2)
    utts = _read(tmp_path, type="jsonl", path=str(path))
    assert [u.id for u in utts] == ["j0", "j1", "j-empty", "j-escape", "j-noaudio"]
    assert (utts[1].speaker, utts[1].description, utts[1].text) == ("s1", "a calm voice", "Line 1.")
    assert _reasons(utts[:2]) == {"j0": None, "j1": None}
    assert utts[2].problem == "empty text"
    assert "outside the dataset folder" in utts[3].problem
    assert utts[4].problem.startswith("missing field: audio")
    assert utts[0].where == f"{path} line 1"


def test_jsonl_inline_array_and_broken_line(tmp_path):
    path = tmp_path / "x.jsonl"
    rec = {"id": "arr", "audio": {"array": [0.0] * 8000, "sampling_rate": 8000}, "text": "zeros"}
    path.write_text(json.dumps(rec) + "\n")
    (utt,) = _read(tmp_path, type="jsonl", path=str(path))
    assert utt.sample_rate == 8000 and utt.audio.shape == (8000,)
    path.write_text(json.dumps(rec) + "\n{not json\n")
    with pytest.raises(SourceError, match="x.jsonl line 2: not valid JSON"):
        _read(tmp_path, type="jsonl", path=str(path))


def _hf_dataset(tmp_path):
    from datasets import Audio, Dataset, DatasetDict

    wavs = [str(make_wav(tmp_path / "hfsrc" / f"h{i}.wav", 0.6 + 0.1 * i, 16000)) for i in range(3)]
    ds = Dataset.from_dict({"audio": wavs, "text": ["one", "two", ""], "speaker": ["a", "b", "a"]}).cast_column(
        "audio", Audio()
    )
    out = tmp_path / "hf"
    DatasetDict({"train": ds, "test": ds.select([0])}).save_to_disk(str(out))
    for w in wavs:
        os.remove(w)  # the saved dataset must carry the audio bytes itself
    return out


def test_hf_load_from_disk_without_torchcodec(tmp_path):
    out = _hf_dataset(tmp_path)
    utts = _read(tmp_path, type="hf", path=str(out))
    assert [(u.id, u.text, u.speaker) for u in utts] == [("train-0", "one", "a"), ("train-1", "two", "b"),
                                                         ("train-2", "", "a")]  # fmt: skip
    assert utts[2].problem == "empty text" and utts[0].where == f"{out}[train] row 0"
    wav = load_utterance_audio(utts[1], 16000, 0.3, 20.0)
    assert wav.shape == (int(0.7 * 16000),) and np.abs(wav).max() > 0.1
    assert len(_read(tmp_path, type="hf", path=str(out), split="test")) == 1


def test_hf_structural_errors(tmp_path):
    out = _hf_dataset(tmp_path)
    with pytest.raises(SourceError, match=r"no split 'validation'; set `split` to one of \['test', 'train'\]"):
        _read(tmp_path, type="hf", path=str(out), split="validation")
    with pytest.raises(SourceError, match="no column 'transcript'; set `text_column`"):
        _read(tmp_path, type="hf", path=str(out), text_column="transcript")


def test_a_hub_dataset_that_cannot_be_loaded_is_named_with_the_fix(tmp_path, monkeypatch):
    """seed 000's sources as `import parler-config` writes them (hub ids) on a machine without the hub: one
    SourceError naming the id and the ways out, not datasets' ConnectionError traceback."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # a cold cache
    with pytest.raises(SourceError, match=r"hub_id='blabble-io/libritts_r' .* cannot be loaded: .*save_to_disk"):
        _read(tmp_path, type="hf", hub_id="blabble-io/libritts_r", hub_config="clean", split="train.clean.360")


@pytest.mark.parametrize("as_dict", [False, True])
def test_hf_audio_paths_must_stay_inside_the_dataset_folder(tmp_path, as_dict):
    from datasets import Dataset

    outside = make_wav(tmp_path / "elsewhere" / "secret.wav", 0.5)
    out = tmp_path / "hf"
    paths = ["clips/in.wav", "../elsewhere/secret.wav", str(outside), "ABS_INSIDE", "clips/link.wav", "a\0b"]
    paths[3] = str(out / "clips" / "in.wav")
    audio = [{"path": p, "bytes": None} for p in paths] if as_dict else paths
    Dataset.from_dict({"audio": audio, "text": [f"row {i}" for i in range(6)]}).save_to_disk(str(out))
    inside = make_wav(out / "clips" / "in.wav", 0.5)  # a dataset that ships its audio files beside it
    os.symlink(outside, out / "clips" / "link.wav")
    utts = _read(tmp_path, type="hf", path=str(out))
    assert [u.problem is None for u in utts] == [True, False, False, True, False, False]
    assert "is not usable" in utts[5].problem  # a row problem, not a crash
    assert utts[0].audio_path == utts[3].audio_path == str(inside.resolve())
    for u in (utts[1], utts[2], utts[4]):
        assert "outside the dataset folder" in u.problem and u.audio_path is None
        assert "datasets.Audio()" in u.problem  # the fix: embed the audio
    assert _reasons(utts[:1]) == {"train-0": None}  # the inside file is really read


def test_demo_source_reads_generated_corpus(tmp_path):
    src = SourceConfig(type="demo", minutes=0.1, voices=["en-us", "en-us+m3"], seed=3)
    utts = list(read_source(src, tmp_path))
    assert demo_folder(src, tmp_path).name.startswith("demo-3-0.1min-")
    assert {u.speaker for u in utts} == {"en-us", "en-us+m3"}
    assert all(u.problem is None and u.text for u in utts)
    assert _reasons(utts, max_duration=20.0) == {u.id: None for u in utts}


def test_hf_descriptions_from_a_metadata_dataset_joined_on_id(tmp_path):
    """Upstream Parler's layout: audio + text in one dataset, the generated descriptions in a metadata dataset
    with the same ids (rows in another order, one id missing: its row gets no description)."""
    from datasets import Audio, Dataset

    wavs = [str(make_wav(tmp_path / "clips" / f"c{i}.wav", 0.6, 16000)) for i in range(3)]
    Dataset.from_dict({"id": ["u0", "u1", "u2"], "audio": wavs, "text": ["one", "two", "three"]}).cast_column(
        "audio", Audio()).save_to_disk(str(tmp_path / "speech"))
    Dataset.from_dict({"id": ["u2", "u0"], "text_description": ["A low voice.", "A fast voice."]}).save_to_disk(
        str(tmp_path / "meta"))
    utts = _read(tmp_path, type="hf", path=str(tmp_path / "speech"), metadata_path=str(tmp_path / "meta"),
                 description_column="text_description")
    assert [(u.id, u.description) for u in utts] == [("u0", "A fast voice."), ("u1", None), ("u2", "A low voice.")]
    with pytest.raises(SourceError, match="no column 'description' to join on; set `description_column`"):
        _read(tmp_path, type="hf", path=str(tmp_path / "speech"), metadata_path=str(tmp_path / "meta"))


def test_every_source_type_reads_a_rows_conversation_and_turn(tmp_path):
    """The three sources with columns (folder metadata.csv, jsonl, hf) read `conversation` and `turn`; a turn that
    is not a whole number rejects the row naming the column; rows without them have neither."""
    from datasets import Audio, Dataset

    clip = make_wav(tmp_path / "d" / "a.wav", 0.6, 16000)
    cells = [("talk-1", "0"), ("talk-1", "2"), ("talk-2", "x"), ("", "")]
    (tmp_path / "d" / "metadata.csv").write_text("id,audio_path,text,conversation,turn\n" + "".join(
        f"r{i},a.wav,hi,{c},{t}\n" for i, (c, t) in enumerate(cells)))
    folder = _read(tmp_path, type="folder", path=str(tmp_path / "d"))
    (tmp_path / "d" / "x.jsonl").write_text("".join(json.dumps(
        {"id": f"r{i}", "audio": "a.wav", "text": "hi", "talk": c or None, "n": int(t) if t.isdigit() else t or None})
        + "\n" for i, (c, t) in enumerate(cells)))
    jsonl = _read(tmp_path, type="jsonl", path=str(tmp_path / "d" / "x.jsonl"), conversation_column="talk",
                  turn_column="n")
    ds = Dataset.from_dict({"audio": [str(clip)] * 4, "text": ["hi"] * 4, "conversation": [c or None for c, _ in cells],
                            "turn": [t or None for _, t in cells]}).cast_column("audio", Audio())
    ds.save_to_disk(str(tmp_path / "hf"))
    hf = _read(tmp_path, type="hf", path=str(tmp_path / "hf"))
    for utts, column in ((folder, "turn"), (jsonl, "n"), (hf, "turn")):
        assert [(u.conversation, u.turn) for u in utts[:2]] == [("talk-1", 0), ("talk-1", 2)], column
        assert utts[2].problem == f"{column} 'x' is not a whole number (the row's place in its conversation)"
        assert (utts[3].conversation, utts[3].turn, utts[3].problem) == (None, None, None)
