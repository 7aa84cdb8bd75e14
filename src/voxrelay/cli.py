"""The ``voxrelay`` command. Thin: parse -> config -> call the library."""

from __future__ import annotations

import json
import logging
import os
import sys
from importlib import resources
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

from voxrelay.cli_paths import reads, user_message, voice_files, writes
from voxrelay.errors import UserError
from voxrelay.paths import GIVEN

app = typer.Typer(
    add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
    help="Train TTS models on ephemeral GPUs with data and checkpoints in object storage.",
)
config_app = typer.Typer(no_args_is_help=True, help="Inspect configurations.")
app.add_typer(config_app, name="config")
out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)

OVERRIDES = typer.Argument(None, help="key.sub=value overrides, e.g. root=/tmp/vr train.max_steps=100")
# a str, not a Path: Path("gs://b/x.yaml") is "gs:/b/x.yaml"
CONFIG = typer.Argument(..., help="YAML config: a local path, or a gs:// / s3:// URI of one in the bucket",
                        callback=reads("pass the path (or gs:// / s3:// URI) of a YAML config file"))
# every path parameter checks its path as it is parsed (voxrelay.cli_paths), before any model loads
A_RUN = reads("pass a run folder <root>/runs/<name> or a folder written by `voxrelay export`", folder=True)


class OwnLines(logging.Filter):
    """What reaches the terminal: voxrelay's log lines, and other libraries' errors; with ``--verbose`` (or
    VOXRELAY_VERBOSE=1, which torchrun's workers inherit) everything (matplotlib's font cache, transformers,
    faster-whisper, Python warnings)."""

    def __init__(self):
        super().__init__()
        self.verbose = os.environ.get("VOXRELAY_VERBOSE", "") not in ("", "0")

    def filter(self, record: logging.LogRecord) -> bool:
        return self.verbose or record.levelno >= logging.ERROR or record.name.split(".")[0] == "voxrelay"


OWN_LINES = OwnLines()


def _setup_logging() -> None:
    from rich.logging import RichHandler

    handler = RichHandler(console=err, show_path=False)
    handler.addFilter(OWN_LINES)
    logging.basicConfig(level=logging.INFO, format="%(message)s", handlers=[handler])
    for noisy in ("httpx", "urllib3", "botocore", "s3fs", "gcsfs", "aiobotocore", "fsspec", "accelerate"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    logging.captureWarnings(True)  # FutureWarnings and the like: through the filter above
    if not OWN_LINES.verbose:  # transformers and the hub print through handlers of their own
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        os.environ.setdefault("HF_HUB_VERBOSITY", "error")
        # transformers' "Loading weights"/"Writing model shards" bars (every from_pretrained) and the hub's: both
        # read this once, at import, so it is set before any loader imports them
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from voxrelay.models.hub_cache import use_local_hub_cache

    use_local_hub_cache()  # not ~/.cache/huggingface on a small root disk


@app.callback()
def _global_options(
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Also show other libraries' log lines "
                                 "(transformers, matplotlib, faster-whisper, warnings); same as VOXRELAY_VERBOSE=1"),
) -> None:
    if verbose:
        OWN_LINES.verbose = True
        os.environ["VOXRELAY_VERBOSE"] = "1"  # torchrun's workers, child processes


def demo_config_path() -> Path:
    return Path(str(resources.files("voxrelay") / "examples" / "demo.yaml"))


@config_app.command("show")
def config_show(config: str = CONFIG, overrides: list[str] = OVERRIDES):
    """Print the resolved config (file + overrides + defaults)."""
    from voxrelay.config import load_config

    out.print(load_config(config, overrides or []).to_yaml(), end="", highlight=False)


@app.command("prepare")
def prepare_cmd(
    config: str = CONFIG,
    overrides: list[str] = OVERRIDES,
    strict: bool = typer.Option(False, "--strict", help="Fail on the first bad row instead of skipping it"),
    overwrite: bool = typer.Option(
        False, "--overwrite", help="Re-encode prepared data made with other parameters (codec.*, durations) in place"
    ),
):
    """Validate + encode the sources into Parquet shards at <root>/prepared/<data.name>/."""
    from voxrelay.config import load_config

    cfg = load_config(config, overrides or [])  # before the heavy imports: a config error comes at once
    from voxrelay.data.prepare import prepare

    report = prepare(cfg, strict=strict, overwrite=overwrite)
    print_prepare_report(report)


def print_prepare_report(report) -> None:
    if not report.counts:  # a non-zero rank: rank 0 reports
        return
    if report.note:
        err.print(report.note, highlight=False, markup=False)
    if report.rejects:  # one line per reject (`file:row id reason`): readable at any width and in logs
        from voxrelay.data.rejects import format_rejects

        for line in format_rejects(report.rejects, report.prepared_uri):
            err.print(line, highlight=False, markup=False)
    c = report.counts
    out.print(
        f"prepared {c['train']} train + {c['eval']} eval utterances ({report.hours:.2f} h), "
        f"{c['rejected']} rejected, shards written {report.written_shards}, reused {report.skipped_shards} "
        f"-> {report.prepared_uri}",
        highlight=False,
    )


@app.command("train")
def train_cmd(
    config: str = CONFIG,
    overrides: list[str] = OVERRIDES,
    fresh: bool = typer.Option(False, "--fresh", help="Ignore existing checkpoints of this run and start over"),
    take_over: bool = typer.Option(
        False, "--take-over", help="Take the run's lease from the session holding it (one whose machine is gone): "
        "it is fenced (its later writes are refused), its lease waited out, and this session resumes",
    ),
):
    """Train (resuming from the run's latest valid checkpoint, if any)."""
    from voxrelay.config import load_config

    cfg = load_config(config, overrides or [])  # before the heavy imports: a config error comes at once
    from voxrelay.cost.usage import refuse_if_spent

    refuse_if_spent(cfg.run_uri, cfg.cost, fresh)  # so does a spent cost.budget
    from voxrelay.train.build import build_run
    from voxrelay.train.loop import train

    run = build_run(cfg, fresh=fresh, take_over=take_over)
    _say_resumed(run)
    result = train(run)
    if run.accelerator.is_main_process:
        out.print(f"trained to step {result.step}; run folder {run.cfg.run_uri}", highlight=False)
    run.exit(result.exit_code)
    raise typer.Exit(result.exit_code)


def _say_resumed(run) -> None:
    if run.resumed_from is not None and run.accelerator.is_main_process:  # once per job, not per process
        err.print(f"resuming {run.cfg.run_uri} from step {run.resumed_from}", highlight=False)


@app.command("plan")
def plan_cmd(
    config: str = CONFIG,
    overrides: list[str] = OVERRIDES,
    gpus: int = typer.Option(1, "--gpus", help="GPUs available; 1, 2, 4, ... up to this many are priced"),
    gpu_memory: str = typer.Option(None, "--gpu-memory", help="Memory of one GPU, e.g. 80GB (10^9 bytes) or 40GiB "
                                   "(default 80GB)"),
    gpu: str = typer.Option(None, "--gpu", help="A GPU by name instead: a100-40gb, a100-80gb, h100, l4, t4, a10g"),
    seq_len: int = typer.Option(None, "--seq-len", help="Tokens per GPU micro-batch (default: from the prepared "
                                "data: the batch budget, or the longest example if longer)"),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object per priced strategy, no table"),
):
    """Predict memory per GPU (weights, grads, optimizer, activations, logits) of each training strategy."""
    from voxrelay.config import load_config
    from voxrelay.plan import configured, make_plan, parse_gpu_memory

    cfg = load_config(config, overrides or [])  # before the heavy imports: a config error comes at once
    gpu_bytes = parse_gpu_memory(gpu_memory, gpu)
    from voxrelay.plan.model import lengths, model_facts, read_index
    from voxrelay.plan.render import print_plan, to_json

    index = read_index(cfg) if seq_len is None else None
    if seq_len is None and index is None:
        lengths(cfg, None, None, None)  # raises: no data and no --seq-len, before the model is built
    facts, model = model_facts(cfg, index)
    plan = make_plan(cfg, facts, lengths(cfg, model, index, seq_len), gpus, gpu_bytes)
    if as_json:
        print(to_json(plan))
    else:
        # never truncate the numbers: a pipe or a narrow terminal gets the full table (and may wrap it)
        print_plan(plan, Console(soft_wrap=True, width=max(out.width, 132)), configured(cfg, gpus))


@app.command("status")
def status_cmd(
    run: str = typer.Argument(..., help="Run folder (<root>/runs/<name>), local or remote", callback=reads(
        "pass the run folder <root>/runs/<name> (it exists once `voxrelay train` has started)", folder=True)),
    cost: bool = typer.Option(False, "--cost", help="Also estimate the spend (USD) so far and to finish: GPU-hours, "
                              "storage requests, egress, replication, checkpoints stored, at the run's cost.* prices"),
):
    """Steps done, last durable checkpoint, staged uploads, throughput, ETA, finished or not."""
    from voxrelay.status import format_status, run_status

    out.print(format_status(run_status(run, cost=cost)), highlight=False)


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
        None, "--description", help="How the voice should sound, for a family that conditions on a description "
        "(e.g. Parler-TTS), e.g. 'A calm female voice, close to the microphone'"
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
    as_json: bool = typer.Option(False, "--json", help="One JSON object per step instead of the table"),
):
    """Score a checkpoint as training's evaluation does: loss, WER/CER, MCD-DTW, speaker similarity; write
    <run>/eval/ and the plot <run>/eval.png."""
    from voxrelay.quality.report import evaluate_source, format_table

    results = evaluate_source(run, step, all_steps, texts, asr_model, num,
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
    from voxrelay.status import voice_input

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
        "where it has one (Parler-TTS: a folder upstream's from_pretrained loads, the DAC included)",
    ),
):
    """Write model.safetensors + config (+ codec) that synthesize and transformers can load (LoRA: merged)."""
    from voxrelay.inference import export_run

    at = export_run(run, output, step, adapter_only, fmt)
    out.print(f"exported step {at} to {output}", highlight=False)


from voxrelay.models.registry import IMPORTERS  # noqa: E402 (torch-free: names only)


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


@app.command("demo")
def demo_cmd(
    root: str = typer.Option("./voxrelay-data", "--root", help="Storage root (local folder, gs://, s3://)",
                             callback=writes("pass another --root, or a gs:// / s3:// URI", folder=True)),
    steps: int = typer.Option(None, "--steps", min=1, help="Training steps (default: the demo config's)"),
    list_voices: bool = typer.Option(False, "--list-voices", help="Print the eSpeak NG voices a demo source can use"),
):
    """Demo corpus -> prepare -> train -> synthesize, on CPU; prints the wav path last."""
    if list_voices:
        from voxrelay.data.demo_corpus import list_voices as voices

        out.print(" ".join(voices()), highlight=False)
        out.print("(each alone or with a variant: +m1 .. +m7, +f1 .. +f5, e.g. en-gb+f3)", highlight=False)
        return
    from voxrelay.config import load_config
    from voxrelay.data.prepare import prepare
    from voxrelay.inference import load_from_run, synthesize
    from voxrelay.train.build import build_run, local_run_dir
    from voxrelay.train.loop import train

    overrides = [f"root={root}"] + ([f"train.max_steps={steps}"] if steps is not None else [])
    cfg = load_config(demo_config_path(), overrides)
    print_prepare_report(prepare(cfg))
    run = build_run(cfg)
    _say_resumed(run)  # a second `voxrelay demo` continues the first
    result = train(run)
    if result.exit_code:
        raise typer.Exit(result.exit_code)
    _demo_scores(cfg.run_uri)
    model, codec, _ = load_from_run(cfg.run_uri)
    wav = local_run_dir(cfg.run_uri) / "demo.wav"
    synthesize(model, codec, "The quiet river carries seven small boats to the old town.", wav,
               temperature=cfg.eval.temperature, top_k=cfg.eval.top_k or 0)  # as its evals speak
    out.print(str(wav.resolve()), highlight=False)


def _demo_scores(run_uri: str) -> None:
    """The demo's last word: does it speak? The final checkpoint on every held-out text, and the plot."""
    from voxrelay.quality.report import evaluate_source, format_table

    (at, metrics), = evaluate_source(run_uri, progress=lambda m: err.print(m, highlight=False))
    err.print(format_table([(at, metrics)]), highlight=False)
    if "eval/wer" in metrics:
        err.print(f"held-out WER {metrics['eval/wer']:.2f} (Whisper; 1.0 = no word right, 0 = every word); "
                  f"curves: {run_uri.rstrip('/')}/eval.png", highlight=False)


from voxrelay import cli_ops  # noqa: E402,F401 (registers `doctor` and `sweep` on app)


def main() -> None:
    """Entry point: a :class:`UserError`, or an OSError on a path the user gave (a disk full at the end), exits
    2 with one line, Ctrl-C exits 130; neither prints a traceback.

    Training handles SIGINT itself (saves, exit 130); typer turns a KeyboardInterrupt inside a
    command into exit 130 as well; this catches the ones outside (start-up, logging set-up).
    """
    GIVEN.clear()
    try:
        _setup_logging()
        app()
    except (UserError, OSError) as e:
        if (message := user_message(e, OWN_LINES.verbose)) is None:
            raise  # an OSError not on a path of the user's: a bug, shown whole
        err.print(f"[red]error:[/red] {escape(message)}", highlight=False)  # a message is text, not markup
        sys.exit(2)
    except KeyboardInterrupt:
        err.print("interrupted", highlight=False)
        sys.exit(130)
