import csv
import json
import sys

import numpy as np
import pytest

from voxrelay.data import demo_corpus
from voxrelay.data.audio import load_audio
from voxrelay.data.demo_corpus import DEFAULT_VOICES, SynthesisError, generate_demo_corpus
from voxrelay.data.demo_text import SentenceMaker, spell_number
from voxrelay.errors import UserError


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return generate_demo_corpus(tmp_path_factory.mktemp("demo") / "c", minutes=0.5, seed=7)


def _rows(folder):
    with open(folder / "metadata.csv", newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def test_layout_minutes_and_speakers(corpus):
    rows = _rows(corpus)
    assert list(rows[0]) == ["id", "audio_path", "text", "speaker"]
    assert {r["speaker"] for r in rows} == set(DEFAULT_VOICES)
    total = 0.0
    for r in rows:
        wav, sr = load_audio(corpus / r["audio_path"])
        assert sr == 22050 and wav.ndim == 1 and np.abs(wav).max() > 0.05
        assert 4 <= len(r["text"].split()) <= 14
        total += len(wav) / sr
    assert 30.0 <= total <= 30.0 + 8.0  # stops at the first clip past the target
    done = json.loads((corpus / "DONE").read_text())
    assert done["utterances"] == len(rows) and done["seed"] == 7
    assert abs(done["seconds"] - total) < 0.01


def test_reproducible_for_a_seed(corpus, tmp_path):
    again = generate_demo_corpus(tmp_path / "again", minutes=0.5, seed=7)
    assert (again / "metadata.csv").read_bytes() == (corpus / "metadata.csv").read_bytes()
    for r in _rows(corpus):
        assert (again / r["audio_path"]).read_bytes() == (corpus / r["audio_path"]).read_bytes(), r["id"]
    other = generate_demo_corpus(tmp_path / "other", minutes=0.5, seed=8)
    assert (other / "metadata.csv").read_bytes() != (corpus / "metadata.csv").read_bytes()


def test_idempotent_and_checks_params(corpus, monkeypatch):
    stamp = (corpus / "DONE").stat().st_mtime_ns
    monkeypatch.setattr(demo_corpus, "_write_corpus_in_child", lambda *a: pytest.fail("regenerated a corpus"))
    assert generate_demo_corpus(corpus, minutes=0.5, seed=7) == corpus
    assert (corpus / "DONE").stat().st_mtime_ns == stamp
    with pytest.raises(ValueError, match="pass another out_dir or delete that folder"):
        generate_demo_corpus(corpus, minutes=0.5, seed=9)


def test_incomplete_folder_is_regenerated(tmp_path):
    stale = tmp_path / "c"
    (stale / "wavs").mkdir(parents=True)
    (stale / "wavs" / "junk.wav").write_bytes(b"partial")
    out = generate_demo_corpus(stale, minutes=0.05, voices=["en-gb+f3"], seed=1)
    assert (out / "DONE").is_file() and not (out / "wavs" / "junk.wav").exists()
    assert {r["speaker"] for r in _rows(out)} == {"en-gb+f3"}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # staging folder removed


def test_never_deletes_a_foreign_folder(tmp_path):
    (tmp_path / "mine.txt").write_text("precious")
    with pytest.raises(ValueError, match=r"is not a demo corpus \(it holds \['mine.txt'\]\)"):
        generate_demo_corpus(tmp_path, minutes=0.05, voices=["en-us"])
    assert (tmp_path / "mine.txt").read_text() == "precious"


def test_unknown_voice_names_the_voice(tmp_path):
    with pytest.raises(SynthesisError, match="no voice 'xx-nonsense'.*voxrelay demo --list-voices") as info:
        generate_demo_corpus(tmp_path / "c", minutes=0.05, voices=["xx-nonsense"])
    assert isinstance(info.value, UserError)
    assert not (tmp_path / "c").exists()


def test_voice_list_and_suggestions():
    languages = demo_corpus.list_voices()
    assert {"en-us", "en-gb", "en-gb-scotland", "de"} <= set(languages) and len(languages) > 50
    assert not any("+" in lang or " " in lang for lang in languages)
    message = demo_corpus.unknown_voice_message("en-uss+f3", languages)
    assert "no voice 'en-uss+f3'" in message and "did you mean 'en-us'" in message
    assert "did you mean" not in demo_corpus.unknown_voice_message("qqqqqq", languages)


def test_no_backend_says_how_to_install(monkeypatch):
    def broken():
        raise OSError("libespeak-ng.so: cannot open shared object file")

    monkeypatch.setattr(demo_corpus._EspeakLibrary, "instance", staticmethod(broken))
    monkeypatch.setattr(demo_corpus.shutil, "which", lambda name: None)
    with pytest.raises(SynthesisError, match="pip install espeakng-loader.*apt-get install espeak-ng"):
        demo_corpus.load_synthesizer()


def test_sentences_and_numbers():
    assert spell_number(0) == "zero"
    assert spell_number(40) == "forty"
    assert spell_number(342) == "three hundred and forty two"
    first = SentenceMaker(np.random.default_rng(1)).sentence()
    maker = SentenceMaker(np.random.default_rng(1))
    texts = [maker.sentence() for _ in range(300)]
    assert texts[0] == first and len(set(texts)) > 250
    assert all(4 <= len(t.split()) <= 14 and t[0].isupper() and t[-1] in ".?" for t in texts)
    assert any(t.endswith("?") for t in texts) and not any(ch.isdigit() for t in texts for ch in t)


def test_binary_backend_with_a_fake_espeak(tmp_path):
    # stands in for `espeak-ng -v VOICE -s RATE -w OUT TEXT`: writes 0.5 s of noise at 22050 Hz
    script = tmp_path / "espeak-ng"
    script.write_text(
        f"#!{sys.executable}\n"
        "import sys, numpy as np, soundfile as sf\n"
        "a = sys.argv[1:]\n"
        "assert a[0] == '-v' and a[2] == '-s' and a[4] == '-w', a\n"
        "sf.write(a[5], np.random.default_rng(0).uniform(-0.5, 0.5, 11025), 22050, subtype='PCM_16')\n"
    )
    script.chmod(0o755)
    wav, sr = demo_corpus._EspeakBinary(str(script)).synth("Hello there.", "en-gb+f3", 160, seed=0)
    assert sr == 22050 and wav.dtype == np.int16 and wav.shape == (11025,)


def test_dialogues_in_seed_003s_layout(tmp_path):
    """layout=dialogues: metadata.csv id,audio_path,text_path,num_speakers,duration_sec(,speaker), a
    [SPEAKER_X] transcript per row whose speakers match num_speakers and the voices the speaker column names,
    one-voice segments of every voice (the voice prompts), the same bytes for the same arguments."""
    from voxrelay.data.sources import read_folder
    from voxrelay.models.vibevoice.script import check_transcript, parse_script, voices_of

    voices = ["en-us", "en-gb+f3"]
    folder = generate_demo_corpus(tmp_path / "d", minutes=0.5, voices=voices, seed=3, layout="dialogues",
                                  sample_rate=24000)
    with open(folder / "metadata.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["id", "audio_path", "text_path", "num_speakers", "duration_sec", "speaker"]
    assert sum(float(r["duration_sec"]) for r in rows) >= 30
    utts = {u.id: u for u in read_folder(folder)}
    for r in rows:
        utt = utts[r["id"]]
        turns, labels = parse_script(utt.text)
        assert utt.problem is None and check_transcript(utt.text, utt.num_speakers, utt.speaker) is None
        assert len(labels) == int(r["num_speakers"]) == len(voices_of(utt.speaker))
        wav, sr = load_audio(folder / r["audio_path"])
        assert sr == 24000 and abs(len(wav) / sr - float(r["duration_sec"])) < 1e-3
    assert {r["speaker"] for r in rows if r["num_speakers"] == "1"} == set(voices)
    assert any(len(parse_script(u.text)[0]) >= 3 for u in utts.values())
    again = generate_demo_corpus(tmp_path / "e", minutes=0.5, voices=voices, seed=3, layout="dialogues",
                                 sample_rate=24000)
    assert (again / "audio" / "d00000.wav").read_bytes() == (folder / "audio" / "d00000.wav").read_bytes()
