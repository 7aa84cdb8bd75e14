"""``voxrelay demo``: the whole pipeline on the built-in corpus, CPU-sized."""

from __future__ import annotations

import typer

from voxrelay.cli.app import app, demo_config_path, err, out
from voxrelay.cli.paths import writes
from voxrelay.cli.pipeline import print_prepare_report, say_resumed


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
    say_resumed(run)  # a second `voxrelay demo` continues the first
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
