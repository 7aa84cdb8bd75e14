"""Each quickstart page (docs/quickstart/) followed as a user follows it, command by command, at tiny sizes: the
commands run as written, with the page's tiny model, codec and sizes appended as overrides (see
tests/helpers/quickstart.py). The user's data is made here the way the page describes it (eSpeak NG speech in a
folder with a metadata.csv), never prepared by voxrelay first."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from tests.helpers.orpheus import save_llama3_tokenizer, save_tiny_llama, save_tiny_snac
from tests.helpers.quickstart import Page, run_page
from tests.helpers.runner import env_for
from tests.helpers.speech import espeak

pytestmark = pytest.mark.slow  # tiers: see tests/conftest.py

DOCS = Path(__file__).resolve().parents[2] / "docs" / "quickstart"
LINES = ["The river carries seven boats to the old town.", "Well, I did not expect that at all!",
         "Mara painted the yellow lantern near the station.", "Did Felix carry the heavy ladder home?",
         "The kettle was broken, so the baker laughed.", "Nadia said the ticket costs forty two coins.",
         "How many candles did Oskar count last winter?", "Why did the pilot hide the muddy scarf?",
         "A quiet dog slept under the wooden bench.", "Seven small birds sang before the rain.",
         "Open the window and let the cold air in.", "The market sells bread, cheese and apples."]
# every quickstart's runs: a few steps, no evals or samples while training, a checkpoint at the end
SHORT = ["data.eval_size=2", "data.shard_size=8", "train.max_steps=3", "train.grad_accum=1", "train.warmup_steps=1",
         "train.eval_every=100", "train.eval_synth=1", "train.log_every=1", "checkpoint.every_steps=3"]
# the demo's model on a few minutes of its corpus (the colab and sweep pages start from `voxrelay init demo`)
DEMO = ["data.sources=[{type: demo, minutes: 0.5, seed: 1, voices: [en-us]}]", "codec.codebook_size=256", *SHORT]
SKIP = {"pip install": "the test runs in the installed tree",
        "huggingface-cli login": "no hub at test time: the models are tiny local ones",
        "gcloud storage cp": "the bucket is a local folder here (storage backends: tests/integration/test_storage*)",
        "sky jobs": "SkyPilot launches cloud VMs; its files are checked in tests/integration/test_templates.py",
        "torchrun": "several GPUs; multi-process training is tests/integration/test_fsdp.py's and test_resume.py's",
        "accelerate launch": "several GPUs",
        "pip wheel": "builds the package from the repository; tests/unit/test_docs.py builds that wheel"}


def write_voice_folder(folder: Path, speaker: str, voice: str = "en-us") -> Path:
    """A folder of clips as a user records them: 44.1 kHz stereo wavs and a metadata.csv (id,audio_path,text,
    speaker)."""
    (folder / "wavs").mkdir(parents=True)
    with open(folder / "metadata.csv", "w", newline="") as f:
        rows = csv.writer(f)
        rows.writerow(["id", "audio_path", "text", "speaker"])
        for i, text in enumerate(LINES, 1):
            audio, rate = espeak(text, voice)
            stereo = np.stack([audio, audio * 0.9], axis=1)
            sf.write(folder / "wavs" / f"{i:04d}.wav", stereo, rate)
            rows.writerow([f"{i:04d}", f"wavs/{i:04d}.wav", text, speaker])
    return folder


def test_orpheus_on_your_own_voice(tmp_path: Path):
    parts = tmp_path / "parts"
    save_tiny_llama(parts / "orpheus", save_llama3_tokenizer(parts / "tok"))
    save_tiny_snac(parts / "snac")
    home = tmp_path / "home"
    write_voice_folder(home / "my-voice", "me")
    page = Page(DOCS / "orpheus-your-voice.md",
                extra=["root=voxrelay-data", f"codec.path={parts / 'snac'}", f"model.init_from={parts / 'orpheus'}",
                       "model.max_seq_len=1024", "train.batch_tokens=1500", *SHORT],
                skip=SKIP, replace={"--check-codec": "--check-codec --clips 3"})
    steps = run_page(page, home, env_for(tmp_path / "cache"))
    print("\n".join(f"{r.seconds:6.1f} s  {r.line[:100]}" for r in steps))
    ran = {r.line: r.result for r in steps}

    check = next(out for line, out in ran.items() if "--check-codec" in line)
    assert "codec snac" in check.stdout + check.stderr, check.stdout + check.stderr
    plan = next(out for line, out in ran.items() if line.startswith("voxrelay plan voice.yaml --gpu l4"))
    assert "this config" in plan.stdout, plan.stdout
    audio, rate = sf.read(home / "hi.wav")
    assert rate == 24000 and audio.size > 0 and np.isfinite(audio).all()
    assert (home / "voxrelay-data/runs/orpheus-lora/eval.png").is_file()
    loaded = next(out for line, out in ran.items() if "LlamaForCausalLM" in line)
    assert loaded.stdout.split() == ["156940", "128260"]


def write_dialogues(folder: Path) -> Path:
    """Two-speaker dialogues as the page describes them: one wav and one one-line transcript per dialogue."""
    (folder / "audio").mkdir(parents=True)
    (folder / "text").mkdir()
    with open(folder / "metadata.csv", "w", newline="") as f:
        rows = csv.writer(f)
        rows.writerow(["id", "audio_path", "text_path", "num_speakers", "duration_sec"])
        for d in range(6):
            a, b = LINES[2 * d], LINES[2 * d + 1]
            first, rate = espeak(a, "en-us")
            second, _ = espeak(b, "en-gb+f3")
            audio = np.concatenate([first, np.zeros(rate // 5, np.float32), second])
            sf.write(folder / "audio" / f"d{d:04d}.wav", audio, rate)
            (folder / "text" / f"d{d:04d}.txt").write_text(f"[SPEAKER_A] {a} [SPEAKER_B] {b}\n")
            rows.writerow([f"d{d:04d}", f"audio/d{d:04d}.wav", f"text/d{d:04d}.txt", 2, f"{len(audio) / rate:.2f}"])
    return folder


def test_vibevoice_on_two_speaker_dialogues(tmp_path: Path):
    from tests.helpers.vibevoice import save_tiny_vibevoice

    ckpt = save_tiny_vibevoice(tmp_path / "tiny-vibevoice")
    home = tmp_path / "home"
    write_dialogues(home / "dialogues")
    for name, voice in (("alice", "en-us"), ("bob", "en-gb+f3")):
        audio, rate = espeak("This is how I sound when I read.", voice)
        sf.write(home / f"{name}.wav", audio, rate)
    page = Page(DOCS / "vibevoice-dialogues.md",
                extra=[f"model.init_from={ckpt}", "model.max_length=1024", "data.max_duration=60",
                       "data.min_duration=0.3", "train.precision=no", "train.batch_tokens=1200", "train.lora.r=4",
                       "train.lr=3e-3", "checkpoint.every_epochs=null", "eval.asr=null", *SHORT],
                skip=SKIP, replace={"-o dialogue.wav": "-o dialogue.wav --max-seconds 2"})
    ran = run_page(page, home, env_for(tmp_path / "cache", {"HF_HUB_OFFLINE": "1"}))
    audio, rate = sf.read(home / "dialogue.wav")
    assert rate == 24000 and audio.size > 0 and np.isfinite(audio).all()
    assert ran[-1].result.stdout.strip() == "VibeVoiceForConditionalGeneration"
    prepared = next(r for r in ran if r.line == "voxrelay prepare dialogues.yaml").result
    assert "without voice prompts" in prepared.stderr  # the page says prepare warns


def test_parler_from_scratch_on_a_bucket(tmp_path: Path):
    from tests.helpers.parler import make_parler_corpus, save_parts
    from tests.helpers.speech import SENTENCES

    parts = save_parts(tmp_path / "parts")
    corpus = make_parler_corpus(tmp_path / "corpus", SENTENCES[:5])
    bucket = tmp_path / "bucket"
    page = Page(DOCS / "parler-from-scratch.md",
                extra=[f"root={bucket}/parler-tts", "data.name=tiny-parler",
                       f"data.sources=[{{type: hf, path: {corpus['speech']}, metadata_path: {corpus['meta']}, "
                       "description_column: text_description}]", "data.min_duration=0.3",
                       f"codec.path={parts['dac']}", "codec.batch_size=4", "model.preset=tiny",
                       f"model.text_encoder={parts['text_encoder']}",
                       f"model.prompt_tokenizer={parts['prompt_tokenizer']}", "train.precision=no",
                       "train.batch_tokens=900", "eval.asr=null", "eval.speaker_similarity=false", *SHORT,
                       # the recipe counts its session from the machine's boot (right on a VM started for it); this
                       # machine may have been up for longer than the limit (23.7 h of 23.5 h: trained 0 steps)
                       "train.time_limit_from=process"],
                skip=SKIP, replace={"gs://my-bucket": str(bucket)})
    home = tmp_path / "home"
    home.mkdir()
    ran = run_page(page, home, env_for(tmp_path / "cache", {"HF_HUB_OFFLINE": "1"}))
    audio, rate = sf.read(home / "hey.wav")
    assert rate == 44100 and audio.size > 0 and np.isfinite(audio).all()
    assert (home / "mini" / "config.json").is_file()
    cost = next(r for r in ran if "--cost" in r.line).result
    assert "USD" in cost.stdout or "$" in cost.stdout, cost.stdout


def test_surviving_colab_sessions_on_drive(tmp_path: Path):
    drive = tmp_path / "drive"
    # `time_limit_from: boot` is right on a Colab runtime (booted with the session); a CI machine may have been up
    # for longer than the page's 11h30m, which ends the session before its first step, as the page says it would
    page = Page(DOCS / "colab-sessions.md", extra=DEMO, skip=SKIP,
                replace={"/content/drive/MyDrive": str(drive), "time_limit_from: boot": "time_limit_from: process"})
    home = tmp_path / "home"
    home.mkdir()
    ran = run_page(page, home, env_for(tmp_path / "cache"))
    run_status = next(r for r in ran if r.line.startswith("voxrelay status")).result.stdout
    assert "finished     yes" in run_status, run_status  # the run lives on "Drive" and finished there
    assert (home / "colab.ipynb").is_file()
    status = next(r for r in ran if r.line.startswith("voxrelay sweep status")).result
    assert status.stdout.count("finished") >= 2, status.stdout


def test_grids_of_experiments_over_spot_vms(tmp_path: Path):
    bucket = tmp_path / "bucket"
    page = Page(DOCS / "sweeps-on-spot-vms.md", extra=[f"root={bucket}/tts", *DEMO], skip=SKIP,
                replace={"gs://my-bucket": str(bucket)})
    home = tmp_path / "home"
    home.mkdir()
    ran = run_page(page, home, env_for(tmp_path / "cache"))
    status = next(r for r in ran if r.line.startswith("voxrelay sweep status")).result
    assert status.stdout.count("finished") == 2, status.stdout
    assert (home / "sweep-job.yaml").is_file()
