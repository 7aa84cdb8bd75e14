"""The speech commands of ``voxrelay`` (``synthesize``, ``eval``, ``voices``, ``export``, ``import``), registered on
:data:`voxrelay.cli.app` in the order of ``voxrelay --help``. Thin, like the rest of the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from voxrelay.cli.app import A_RUN, app, err, out
from voxrelay.cli.paths import reads, voice_files, writes
from voxrelay.models.registry import FAMILIES, IMPORTERS  # torch-free: names only

# `export --format`: each family's upstream layouts (FamilySpec.export_formats)
UPSTREAM_FORMATS = ", ".join(f"{fmt} (model.family={spec.name})" for spec in FAMILIES.values()
                             for fmt in spec.export_formats) or "none"


@app.command("synthesize")
def synthesize_cmd(
    run: str = typer.Argument(..., help="Run folder (<root>/runs/<name>) or an export folder", callback=A_RUN),
    text: str = typer.Argument(None, help="Text to speak (or --script)"),
    output: Path = typer.Option(..., "-o", "--output", help="Output .wav", callback=writes("pass another -o")),
    voice: list[str] = typer.Option(
        None, "--voice", help="Speaker of the training data (`voxrelay voices RUN` lists them; default: the first); "
        "for a family that clones voices from prompts: SPEAKER=clip.wav, once per speaker of the script",
        callback=reads("pass SPEAKER=FILE with a wav or flac file", pick=voice_files),
    ),
    script: Path = typer.Option(None, "--script", help="A text file to speak instead of TEXT: `Speaker 0: ...` or "
                                "`[SPEAKER_A] ...` lines for a dialogue", callback=reads("pass a UTF-8 text file")),
    max_seconds: float = typer.Option(20.0, "--max-seconds", help="Longest audio to generate"),
    description: str = typer.Option(
        None, "--description", help="How the voice should sound, for a family that conditions on a description, "
        "e.g. 'A calm female voice, close to the microphone'"
    ),
    step: int = typer.Option(None, "--step", help="Checkpoint step (default: latest valid)"),
    seed: int = typer.Option(0, "--seed", help="Sampling seed: the same seed, text and weights give the same audio"),
    temperature: float = typer.Option(0.8, "--temperature", help="Sampling temperature (0 = greedy)"),
    top_p: float = typer.Option(None, "--top-p", help="Nucleus sampling: the smallest set of codes whose probability "
                                "reaches P (1 = off); default: the family's, its upstream's"),
    repetition_penalty: float = typer.Option(
        None, "--repetition-penalty", help="Divide the logits of codes already in the sequence by this (1 = off); "
        "default: the family's, its upstream's"),
):
    """Speak TEXT (or a --script) with a trained model into a wav file."""
    from voxrelay import inference as inf

    inf.check_synthesis_args(output, temperature, max_seconds=max_seconds)  # before the model loads
    inf.check_sampling_args(top_p, repetition_penalty)
    text = inf.read_text_or_script(text, script)  # before the model loads
    inf.check_voice_prompts(run, voice)  # every clip read before the model loads
    model, codec, what = inf.load_any(run, step)
    request = inf.build_request(model, codec, text, None, voice, description)
    seconds = inf.synthesize(model, codec, request, output, temperature=temperature, seed=seed,
                             max_seconds=max_seconds, top_p=top_p, repetition_penalty=repetition_penalty)
    err.print(f"{what}: {seconds:.2f} s of audio")
    if seconds == 0:
        err.print("[yellow]warning:[/yellow] the model ended its speech at once: the wav holds no audio (an "
                  "untrained or diverged model does this; `voxrelay eval` shows eval/empty_frac)")
    out.print(str(output), highlight=False)


@app.command("eval")
def eval_cmd(
    run: str = typer.Argument(..., help="Run folder (<root>/runs/<name>) or an export folder (with --texts)",
                              callback=A_RUN),
    step: int = typer.Option(None, "--step", help="Checkpoint step (default: the newest valid)"),
    all_steps: bool = typer.Option(False, "--all", help="Every checkpoint the run keeps, a table row each"),
    texts: Path = typer.Option(None, "--texts", help="Speak these instead of the held-out texts: one per line, "
                               "`speaker|text` for a voice, or a .jsonl file of {text, speaker, description, id} "
                               "(no references: WER/CER only)",
                               callback=reads("pass a UTF-8 text file, one text per line")),
    num: int = typer.Option(None, "--num", min=1, help="Only the first N texts (training's evals speak "
                            "train.eval_synth of them: --num that gives its numbers; default: all held-out texts)"),
    asr_model: str = typer.Option(None, "--asr-model", help="Whisper for WER/CER instead of the run's eval.asr.model"),
    utmos: str = typer.Option(None, "--utmos", help="Score UTMOS too (eval.utmos): `true` fetches SpeechMOS' "
                              "weights once, or the path or URL of utmos22_strong_step7459_v1.pt"),
    as_json: bool = typer.Option(False, "--json", help="One JSON object per step instead of the table"),
):
    """Score a checkpoint as training's evaluation does: loss, WER/CER, MCD-DTW, speaker similarity (UTMOS with
    --utmos or eval.utmos); write <run>/eval/ and the plot <run>/eval.png."""
    from voxrelay.quality.report import evaluate_source, format_table

    results = evaluate_source(run, step, all_steps, texts, asr_model, num, utmos=utmos,
                              progress=lambda m: err.print(m, highlight=False))
    if as_json:
        for at, metrics in results:
            out.print(json.dumps({"step": at, **metrics}), highlight=False, soft_wrap=True)
        return
    out.print(format_table(results), highlight=False)
    if results[0][0] != "export":
        err.print(f"results in {run.rstrip('/')}/eval/, curves in {run.rstrip('/')}/eval.png", highlight=False)


@app.command("voices")
def voices_cmd(run: str = typer.Argument(..., help="Run folder (<root>/runs/<name>) or an export folder",
                                         callback=A_RUN)):
    """List the voices (speakers) a run knows, one per line, for `synthesize --voice`; for a model that clones
    voices from prompts, say how to pass them."""
    from voxrelay.monitor.status import voice_input

    voices = voice_input(run)
    if voices.prompts:
        err.print(f"{run}: model.family={voices.family} clones each speaker of a script from a voice prompt (a few "
                  "seconds of that speaker alone) and has no named voices. Give one clip per speaker, numbered in "
                  "the order of the script's labels ([SPEAKER_A] or Speaker 0 is 0, the next 1): voxrelay synthesize "
                  f"{run} --script dialogue.txt --voice 0=alice.wav --voice 1=bob.wav -o out.wav (one speaker: "
                  "--voice clip.wav); without --voice it speaks in voices of its own", highlight=False)
        return
    if not voices.names:
        err.print(f"{run}: a single-speaker model (no --voice needed)")
    for name in voices.names:
        out.print(name, highlight=False)


@app.command("export")
def export_cmd(
    run: str = typer.Argument(..., help="Run folder (<root>/runs/<name>)",
                              callback=reads("pass a run folder <root>/runs/<name>", folder=True)),
    output: Path = typer.Option(..., "-o", "--output", help="Output folder",
                                callback=writes("pass another -o (a new or empty folder)", folder=True)),
    step: int = typer.Option(None, "--step", help="Checkpoint step (default: latest valid)"),
    adapter_only: bool = typer.Option(
        False, "--adapter-only", help="LoRA runs: write the adapter (peft files) instead of the merged model; "
        "synthesize rebuilds the base from model.init_from (or the seeded random init)",
    ),
    fmt: str = typer.Option(
        "voxrelay", "--format", help="voxrelay (what synthesize/eval read back), or the family's upstream format "
        "where it has one, a folder upstream's from_pretrained loads: " + UPSTREAM_FORMATS,
    ),
):
    """Write model.safetensors + config (+ codec) that synthesize and transformers can load (LoRA: merged)."""
    from voxrelay.inference import export_run

    at = export_run(run, output, step, adapter_only, fmt)
    out.print(f"exported step {at} to {output}", highlight=False)


@app.command("import")
def import_cmd(
    kind: str = typer.Argument(..., help="What FILE is, an upstream training config of a family: "
                               + ", ".join(IMPORTERS)),
    file: Path = typer.Argument(..., help="The upstream file", callback=reads("pass the upstream file")),
    output: Path = typer.Option(..., "-o", "--output", help="The voxrelay config (YAML) to write",
                                callback=writes("pass another -o (the .yaml file to write)")),
    prepared: str = typer.Option(None, "--prepared", help="Prepared data (<root>/prepared/<name>, local or in a "
                                 "bucket) whose size turns the file's epochs into train.max_steps",
                                 callback=reads("pass <root>/prepared/<name>", folder=True)),
):
    """Turn an upstream training config into a voxrelay config; prints every field dropped and why."""
    from voxrelay.models.registry import get_importer
    from voxrelay.paths import write_file

    text, notes = get_importer(kind)(file, prepared)
    write_file(output, text.encode("utf-8"))
    for note in notes:
        err.print(f"note: {note}", highlight=False)
    out.print(str(output), highlight=False)
