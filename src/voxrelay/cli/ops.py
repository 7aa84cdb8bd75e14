"""The operations commands of ``voxrelay`` (``doctor``, ``sweep``), registered on :data:`voxrelay.cli.app`.
Thin, like the rest of the CLI: parse -> config -> call the library."""

from __future__ import annotations

import typer
from rich.console import Console

from voxrelay.cli.app import CONFIG, OVERRIDES, app, err, out
from voxrelay.cli.paths import reads, sweep_file


@app.command("doctor")
def doctor_cmd(
    config: str = CONFIG,
    overrides: list[str] = OVERRIDES,
    probe_mb: float = typer.Option(32.0, "--probe-mb", min=0, help="Size in MB of the object written to the root, "
                                   "read back and deleted to measure throughput (0: no probe)"),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object per check, no table"),
):
    """Check the setup's storage, cost and machine traps, each with a verdict and its fix; exit 1 if one fails.

    Bucket region vs this machine's (metadata server), multi-/dual-region replication, soft delete, versioning,
    storage class, lifecycle rules, throughput to the root (a probe object, deleted), a mounted root (gcsfuse,
    Drive), local disk, the Hugging Face cache, GPU memory vs `voxrelay plan`."""
    from voxrelay.config import load_config

    cfg = load_config(config, overrides or [])  # before the checks: a config error comes at once (exit 2)
    from voxrelay.doctor import exit_code
    from voxrelay.doctor.diagnose import diagnose, print_checks, to_json

    checks = diagnose(cfg, probe_mb)
    if as_json:
        print(to_json(checks))
    else:
        print_checks(checks, Console(soft_wrap=True, width=max(out.width, 132)))
    raise typer.Exit(exit_code(checks))


@app.command("sweep")
def sweep_cmd(
    args: list[str] = typer.Argument(..., help="SWEEP.yaml [overrides for every experiment], or `status SWEEP.yaml "
                                     "[overrides]` for the table and the plot", callback=reads(
                                         "pass the path (or gs:// / s3:// URI) of a sweep YAML file", pick=sweep_file)),
    retry_failed: bool = typer.Option(False, "--retry-failed", help="Train failed experiments again (once each)"),
):
    """Run a grid/list of experiments (a worker: any number, on any machines; re-run to go on), or `sweep status`."""
    from voxrelay.sweep.spec import load_sweep

    showing = args[0] == "status" and len(args) > 1
    sweep = load_sweep(*(args[1], args[2:]) if showing else (args[0], args[1:]))
    if showing:
        from voxrelay.sweep.report import report

        text, plot = report(sweep)
        out.print(text, highlight=False)
        if plot is not None:
            err.print(f"eval curves: {plot}", highlight=False)
        return
    from voxrelay.sweep.worker import run_sweep

    raise typer.Exit(run_sweep(sweep, retry_failed))
