"""The ``voxrelay`` command's application: the typer app, the consoles, the arguments commands share, and the
log set-up. The commands register themselves on :data:`app` in the modules beside this one."""

from __future__ import annotations

import logging
import os
from importlib import resources
from pathlib import Path

import typer
from rich.console import Console

from voxrelay.cli.paths import reads

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
# every path parameter checks its path as it is parsed (voxrelay.cli.paths), before any model loads
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
    setup_environment()


def setup_environment() -> None:
    """What this process tells the libraries through their environment variables, which they read once, at
    import: so it runs before any of them is imported (the test suite's forking interpreter runs it before it
    imports them, as a command would)."""
    if not OWN_LINES.verbose:  # transformers and the hub print through handlers of their own
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        os.environ.setdefault("HF_HUB_VERBOSITY", "error")
        # transformers' "Loading weights"/"Writing model shards" bars (every from_pretrained) and the hub's: both
        # read this once, at import, so it is set before any loader imports them
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from voxrelay.models.hub_cache import use_local_hub_cache

    use_local_hub_cache()  # not ~/.cache/huggingface on a small root disk


def _print_version(value: bool) -> None:
    if value:
        from voxrelay import __version__

        out.print(f"voxrelay {__version__}", highlight=False)
        raise typer.Exit()


@app.callback()
def _global_options(
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Also show other libraries' log lines "
                                 "(transformers, matplotlib, faster-whisper, warnings); same as VOXRELAY_VERBOSE=1"),
    version: bool = typer.Option(False, "--version", help="Print voxrelay's version and exit", is_eager=True,
                                 callback=_print_version),
) -> None:
    if verbose:
        OWN_LINES.verbose = True
        os.environ["VOXRELAY_VERBOSE"] = "1"  # torchrun's workers, child processes


def demo_config_path() -> Path:
    return Path(str(resources.files("voxrelay") / "examples" / "demo.yaml"))
