"""What reaches the terminal: voxrelay's own log lines and other libraries' errors, not their info lines or
warnings (matplotlib building its font cache, transformers, Python warnings), unless --verbose /
VOXRELAY_VERBOSE=1. Each case in a fresh interpreter with an empty matplotlib cache, as a new user's first run."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

SCRIPT = """
import logging, warnings
from voxrelay.cli import _setup_logging, app
_setup_logging()
import matplotlib.font_manager  # a fresh MPLCONFIGDIR: logs "generated new fontManager" (INFO)
logging.getLogger("faster_whisper").warning("third-party warning")
logging.getLogger("botocore.hooks").error("third-party error")
logging.getLogger("voxrelay.train.loop").info("our own line")
warnings.warn("a FutureWarning of some library", FutureWarning)
"""


def _stderr(tmp_path, verbose: bool) -> str:
    env = dict(os.environ, MPLCONFIGDIR=str(tmp_path / ("v" if verbose else "q")), COLUMNS="200")
    env.pop("VOXRELAY_VERBOSE", None)
    if verbose:
        env["VOXRELAY_VERBOSE"] = "1"
    res = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return res.stderr


def test_other_libraries_lines_reach_the_terminal_only_when_verbose(tmp_path):
    pytest.importorskip("matplotlib")
    quiet, loud = _stderr(tmp_path, False), _stderr(tmp_path, True)
    assert "our own line" in quiet and "third-party error" in quiet
    for line in ("generated new fontManager", "third-party warning", "FutureWarning of some library"):
        assert line not in quiet, quiet
        assert line in loud, loud


def test_verbose_is_a_global_option(tmp_path):
    from typer.testing import CliRunner

    from voxrelay.cli import OWN_LINES, app

    before = OWN_LINES.verbose
    try:
        res = CliRunner().invoke(app, ["--verbose", "config", "show", str(tmp_path / "none.yaml")])
        assert OWN_LINES.verbose and os.environ.get("VOXRELAY_VERBOSE") == "1", res.output
    finally:
        OWN_LINES.verbose = before
        os.environ.pop("VOXRELAY_VERBOSE", None)


LOADERS = """
import sys
from voxrelay.cli import _setup_logging
_setup_logging()
from transformers import T5EncoderModel
from voxrelay.codecs.dac import DacCodec
DacCodec.from_pretrained(sys.argv[1])  # every command that reads DAC codes
T5EncoderModel.from_pretrained(sys.argv[2])  # any other transformers model
print("loaded")
"""


def test_transformers_loading_bars_reach_the_terminal_only_when_verbose(tmp_path):
    """transformers 5 draws a "Loading weights" bar for every from_pretrained (the DAC on every prepare,
    synthesize, eval, export; T5, Llama, VibeVoice): other libraries' chatter, shown with --verbose only."""
    from tests.helpers.parler import save_tiny_dac, save_tiny_t5

    dac, t5 = save_tiny_dac(tmp_path / "dac"), save_tiny_t5(tmp_path / "t5", 32)
    for verbose in (False, True):
        env = {k: v for k, v in os.environ.items() if k not in ("VOXRELAY_VERBOSE", "HF_HUB_DISABLE_PROGRESS_BARS")}
        env |= {"VOXRELAY_VERBOSE": "1"} if verbose else {}
        res = subprocess.run([sys.executable, "-c", LOADERS, str(dac), str(t5)], env=env, capture_output=True,
                             text=True, timeout=120)
        assert res.returncode == 0 and "loaded" in res.stdout, res.stderr
        assert res.stderr.count("Loading weights") >= (2 if verbose else 0), res.stderr
        if not verbose:
            assert "Loading weights" not in res.stderr, res.stderr
