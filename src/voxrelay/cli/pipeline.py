"""``voxrelay config show``, ``prepare``, ``train``, ``plan`` and ``status``."""

from __future__ import annotations

import typer
from rich.console import Console

from voxrelay.cli.app import CONFIG, OVERRIDES, app, config_app, err, out
from voxrelay.cli.paths import reads


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
    check_codec: bool = typer.Option(
        False, "--check-codec", help="Prepare nothing: round-trip a sample of the clips through codec.* and report "
        "MCD-DTW and, with eval.asr, the WER/CER of recordings vs round trips (wavs + report.json in "
        "<prepared>/codec_check/)",
    ),
    clips: int = typer.Option(16, "--clips", min=1, help="With --check-codec: how many clips to check"),
    check_text: bool = typer.Option(
        False, "--check-text", help="Prepare nothing: list the transcripts' characters the model's text vocabulary "
        "does not know or splits, and the model.add_tokens that gives each its own token",
    ),
):
    """Validate + encode the sources into Parquet shards at <root>/prepared/<data.name>/."""
    from voxrelay.config import load_config

    cfg = load_config(config, overrides or [])  # before the heavy imports: a config error comes at once
    if check_text:
        from voxrelay.data.codec_check import text_coverage

        print_text_coverage(cfg.model, *text_coverage(cfg))
        return
    if check_codec:
        from voxrelay.data.codec_check import check_codec as run_check

        print_codec_check(run_check(cfg, clips))
        return
    from voxrelay.data.prepare import prepare

    report = prepare(cfg, strict=strict, overwrite=overwrite)
    print_prepare_report(report)


def print_text_coverage(model_cfg, found: list | None, chars: int) -> None:  # noqa: ANN001 (the model section)
    """The characters a family's vocabulary lacks, most frequent first, and the setting that adds them (the
    family's ``text_coverage_fix``)."""
    if found is None:
        out.print(f"model.family={model_cfg.family} reads text as bytes or phonemes: every character is covered")
        return
    if not found:
        out.print(f"every character of the transcripts ({chars} in all) has its own token")
        return
    out.print(f"{'character':<10} {'count':>8}  tokenized as", highlight=False)
    for char, count, how in found[:40]:
        out.print(f"{char!r:<10} {count:>8}  {how}", highlight=False, markup=False)
    share = sum(c for _, c, _ in found) / max(chars, 1)
    addable = [c for c, _, how in found if "cannot" not in how]
    line = f"{len(found)} distinct characters ({share:.1%} of the transcripts' {chars} characters) are split or unknown"
    if addable:
        which = "each" if len(addable) == len(found) else f"{len(addable)} of them"
        line += f"; to give {which} a token of its own: {model_cfg.text_coverage_fix(addable)}"
    out.print(line, highlight=False, markup=False)


def print_codec_check(report) -> None:
    """One line per clip, then the sample's figures and where the round trips are."""
    for s in report.skipped:
        err.print(f"{s['where']} {s['id']}: skipped, {s['reason']}", highlight=False, markup=False)
    asr = "recording_wer" in report.summary
    out.print(f"{'clip':<24} {'seconds':>7} {'MCD dB':>7}" + (f" {'WER rec':>8} {'WER trip':>8} {'CER rec':>8} "
              f"{'CER trip':>8}" if asr else ""), highlight=False)
    for c in report.clips:
        out.print(f"{c['id'][:24]:<24} {c['seconds']:>7.2f} {c['mcd_db']:>7.2f}" + (
            f" {c['recording_wer']:>8.3f} {c['round_trip_wer']:>8.3f} {c['recording_cer']:>8.3f} "
            f"{c['round_trip_cer']:>8.3f}" if asr else ""), highlight=False, markup=False)
    s = report.summary
    line = f"codec {report.codec.get('type')}: {s['clips']} clips, mean MCD-DTW {s['mcd_db']:.2f} dB"
    if asr:
        line += (f"; WER {s['recording_wer']:.3f} on the recordings -> {s['round_trip_wer']:.3f} on the round trips, "
                 f"CER {s['recording_cer']:.3f} -> {s['round_trip_cer']:.3f} (by {s['asr']})")
    else:
        line += " (no WER: eval.asr is off)"
    out.print(f"{line}; round trips and report.json in {report.uri}", highlight=False, markup=False)


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
    import voxrelay
    from voxrelay.checkpoint.host import stop_with_launcher
    from voxrelay.config import load_config

    stop_with_launcher(voxrelay.PARENT_AT_IMPORT)  # a torchrun worker stops (saves) when its launcher dies

    cfg = load_config(config, overrides or [])  # before the heavy imports: a config error comes at once
    from voxrelay.cost.usage import refuse_if_spent

    refuse_if_spent(cfg.run_uri, cfg.cost, fresh)  # so does a spent cost.budget
    from voxrelay.train.build import build_run
    from voxrelay.train.loop import train
    from voxrelay.train.stops import LEASE_LOST

    run = build_run(cfg, fresh=fresh, take_over=take_over)
    say_resumed(run)
    result = train(run)
    if run.accelerator.is_main_process and result.stop_reason != LEASE_LOST:  # taken over: the run is not ours
        out.print(f"trained to step {result.step}; run folder {run.cfg.run_uri}", highlight=False)
    run.exit(result.exit_code)
    raise typer.Exit(result.exit_code)


def say_resumed(run) -> None:
    if run.resumed_from is None or not run.accelerator.is_main_process:  # once per job, not per process
        return
    if run.resumed_from >= run.cfg.train.max_steps:  # nothing left to train: not a resume
        err.print(f"{run.cfg.run_uri} is already trained to step {run.resumed_from} (train.max_steps "
                  f"{run.cfg.train.max_steps}): nothing to train; raise train.max_steps to train on", highlight=False)
    else:
        err.print(f"resuming {run.cfg.run_uri} from step {run.resumed_from}", highlight=False)


@app.command("plan")
def plan_cmd(
    config: str = CONFIG,
    overrides: list[str] = OVERRIDES,
    gpus: int = typer.Option(1, "--gpus", help="GPUs available; 1, 2, 4, ... up to this many are priced"),
    gpu_memory: str = typer.Option(None, "--gpu-memory", help="Memory of one GPU, e.g. 80GB (10^9 bytes) or 40GiB "
                                   "(default 80GB)"),
    gpu: str = typer.Option(None, "--gpu", help="A GPU by name instead: t4, v100, l4, a10g, rtx3090, rtx4090, "
                            "a100-40gb, l40s, a100-80gb, h100, h200; or a Colab runtime with its host RAM: colab-t4 "
                            "(12.7 GB), colab-l4, colab-a100"),
    host_memory: str = typer.Option(None, "--host-memory", help="RAM of one machine, e.g. 12.7GB (default: the "
                                    "--gpu colab-* runtime's, else this machine's; with --cheapest: checked only "
                                    "when given)"),
    seq_len: int = typer.Option(None, "--seq-len", help="Tokens per GPU micro-batch (default: from the prepared "
                                "data: the batch budget, or the longest example if longer)"),
    cheapest: bool = typer.Option(False, "--cheapest", help="Price the run on every known card instead: the "
                                  "cheapest card and count that fits and what train.max_steps steps cost there"),
    spot: bool = typer.Option(False, "--spot", help="With --cheapest: spot prices instead of on-demand"),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON array, one object per priced strategy, no table"),
):
    """Predict memory per GPU (weights, grads, optimizer, activations, logits) and host RAM of each strategy."""
    from voxrelay.config import load_config
    from voxrelay.plan import parse_gpu_memory

    cfg = load_config(config, overrides or [])  # before the heavy imports: a config error comes at once
    gpu_bytes = parse_gpu_memory(gpu_memory, gpu)
    from voxrelay.plan.model import lengths, model_facts, read_index

    index = read_index(cfg) if seq_len is None else None
    if seq_len is None and index is None:
        lengths(cfg, None, None, None)  # no data, no --seq-len, batch_seconds: raises before the model is built
    facts, model = model_facts(cfg, index)
    _print_plan(cfg, facts, lengths(cfg, model, index, seq_len), gpus, gpu_bytes, gpu, host_memory, cheapest, spot,
                as_json)


def _print_plan(cfg, facts, lengths, gpus: int, gpu_bytes: int, gpu: str | None, host_memory: str | None,
                cheapest: bool, spot: bool, as_json: bool) -> None:
    from voxrelay.plan import PlanError, configured, gpu_bf16, host_memory_of, host_source, make_plan
    from voxrelay.plan.render import print_plan, to_json

    console = Console(soft_wrap=True, width=max(out.width, 132))
    if spot and not cheapest:
        raise PlanError("--spot prices the --cheapest answer: add --cheapest (or leave --spot out)")
    if cheapest:
        from voxrelay.plan import cheapest as cheap

        if gpu is not None:  # every card is priced, each with its own memory: not a Colab runtime's RAM for all
            err.print(f"--gpu {gpu} is ignored with --cheapest (every card of the table is priced); host RAM is "
                      "checked against --host-memory only", highlight=False)
        host = host_memory_of(host_memory, None, this_machine=False)
        found = cheap.offers(cfg, facts, lengths, gpus, spot, host, cheap.measured_step_seconds(cfg.run_uri))
        if as_json:
            print(cheap.to_json(found))
        else:
            short = cheap.host_shortfall(cfg, facts, lengths, gpus) if not found and host is not None else None
            cheap.print_offers(found, console, spot, host, short)
        return
    host = host_memory_of(host_memory, gpu, this_machine=True)
    plan = make_plan(cfg, facts, lengths, gpus, gpu_bytes, gpu_bf16(gpu), host)
    plan.host_source = host_source(host_memory, gpu)
    if as_json:
        print(to_json(plan))
    else:
        # never truncate the numbers: a pipe or a narrow terminal gets the full table (and may wrap it)
        print_plan(plan, console, configured(cfg, gpus))


@app.command("status")
def status_cmd(
    run: str = typer.Argument(..., help="Run folder (<root>/runs/<name>), local or remote", callback=reads(
        "pass the run folder <root>/runs/<name> (it exists once `voxrelay train` has started)", folder=True)),
    cost: bool = typer.Option(False, "--cost", help="Also estimate the spend (USD) so far and to finish: GPU-hours, "
                              "storage requests, egress, replication, checkpoints stored, at the run's cost.* prices"),
):
    """Steps done, last durable checkpoint, staged uploads, throughput, ETA, finished or not."""
    from voxrelay.monitor.status import format_status, run_status

    out.print(format_status(run_status(run, cost=cost)), highlight=False)
