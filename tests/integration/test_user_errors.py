"""Every command, driven as a user would with bad input: exit code 2, a one-paragraph message that names
the bad key/file/value, and no traceback.

One tiny prepared root and a 2-step run are made once for the module; the cases run as `voxrelay.cli.main()` with
their command line, all in one child process (tests/helpers/cli_batch.py: the start-up of torch paid once), but a
case with an environment of its own, which gets a `python -m voxrelay ...` process. No network: hub lookups run
with HF_HUB_OFFLINE=1.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.helpers.runner import CONFIG, can_hide_folders, env_for, in_mount_namespace, voxrelay
from tests.helpers.tiny import tiny

pytestmark = pytest.mark.slow  # tiers: see tests/conftest.py


@dataclass
class World:
    """What the cases point at: a prepared root, a trained run and a few folders that are not what they claim."""

    tmp: Path
    root: str
    run: str
    env: dict

    def train(self, *overrides: str) -> list[str]:
        return ["train", CONFIG, *tiny(self.root, *overrides)]

    def prepare(self, *overrides: str) -> list[str]:
        return ["prepare", CONFIG, *tiny(self.root, *overrides)]


def _plain_lm(folder: Path, **config_changes) -> Path:
    """A 1-layer Llama saved with save_pretrained, its config.json then edited (shapes that disagree)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2)
    LlamaForCausalLM(config).save_pretrained(str(folder))
    saved = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**saved, **config_changes}))
    return folder


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    tmp = tmp_path_factory.mktemp("user-errors")
    env = env_for(tmp / "cache", {"HF_HUB_OFFLINE": "1", "COLUMNS": "200"})
    root = str(tmp / "root")
    w = World(tmp, root, f"{root}/runs/demo", env)
    for args in (w.prepare(), w.train("train.max_steps=2"), ["export", w.run, "-o", str(tmp / "future")]):
        res = voxrelay(*args, env=env)
        assert res.returncode == 0, res.stdout + res.stderr
    meta = json.loads((tmp / "future" / "voxrelay.json").read_text())  # an export of a family we do not know
    (tmp / "future" / "voxrelay.json").write_text(json.dumps({**meta, "family": "future_tts"}))
    (tmp / "empty").mkdir()
    (tmp / "empty.txt").write_text("\n  \n")
    (tmp / "notyaml.yaml").write_text("name: [unclosed\n")
    (tmp / "bad.jsonl").write_text('{"text": "Hello."}\n{"text": "Hi.", "voice": "x"}\n')
    _plain_lm(tmp / "lm-wrong-shapes", hidden_size=64)
    _plain_lm(tmp / "lm-no-weights")
    (tmp / "lm-no-weights" / "model.safetensors").unlink()
    (tmp / "not-snac").mkdir()
    (tmp / "not-snac" / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 8}))
    # wandb hidden whether or not it is installed: a package that fails to import, as a broken install does
    (tmp / "no-wandb" / "wandb").mkdir(parents=True)
    (tmp / "no-wandb" / "wandb" / "__init__.py").write_text("raise ImportError('wandb hidden by the test')\n")
    return w


# (args of `voxrelay`, strings the message must contain, extra environment)
Case = Callable[[World], tuple[list[str], list[str], dict]]

CASES: dict[str, Case] = {
    # prepare: the codec
    "snac-without-codec.path": lambda w: (w.prepare("codec.type=snac"), ["codec.type 'snac' needs codec.path"], {}),
    "snac-path-missing": lambda w: (
        w.prepare("codec.type=snac", f"codec.path={w.tmp}/absent"),
        [f"{w.tmp}/absent' does not exist", "hub id"], {}),
    "snac-path-not-snac": lambda w: (
        w.prepare("codec.type=snac", f"codec.path={w.tmp}/not-snac"), ["not-snac/config.json is not a SNAC"], {}),
    "snac-path-empty-folder": lambda w: (
        w.prepare("codec.type=snac", f"codec.path={w.tmp}/empty"), ["empty' is not a SNAC folder"], {}),
    "dac-path-not-dac": lambda w: (
        w.prepare("codec.type=dac", f"codec.path={w.tmp}/not-snac"), ["not-snac' is not a DAC folder"], {}),
    "snac-hub-id-offline": lambda w: (
        w.prepare("codec.type=snac", "codec.path=nobody/no-codec"), ["'nobody/no-codec'", "hub id"], {}),
    # prepare: the sources and the config itself
    "unknown-demo-voice": lambda w: (
        w.prepare("data.sources=[{type: demo, minutes: 0.1, voices: [xx-nope]}]"),
        ["no voice 'xx-nope'", "voxrelay demo --list-voices"], {}),
    "config-file-missing": lambda w: (
        ["prepare", f"{w.tmp}/absent.yaml"], ["CONFIG", "absent.yaml' cannot be read: No such file or directory"], {}),
    "config-file-not-yaml": lambda w: (["train", f"{w.tmp}/notyaml.yaml"], ["notyaml.yaml: not valid YAML"], {}),
    "codebook-bigger-than-the-audio": lambda w: (
        w.prepare("data.name=big-codebook", "codec.codebook_size=65536"),
        ["codec.codebook_size=65536 centroids", "prepare more audio", "or lower codec.codebook_size"], {}),
    "override-without-equals": lambda w: (w.prepare("train.max_steps"), ["'train.max_steps' is not key=value"], {}),
    "unknown-key": lambda w: (w.prepare("train.max_stepz=3"), ["train.max_stepz: unknown key"], {}),
    "config-show-unknown-key": lambda w: (["config", "show", CONFIG, "modle.hidden_size=8"], ["modle"], {}),
    "config-show-unknown-family": lambda w: (
        ["config", "show", CONFIG, "model.family=parlor"], ["model.family='parlor'", "one of: causal_lm, codec_lm"],
        {}),
    "unknown-family": lambda w: (w.train("name=fam", "model.family=parlor"), ["model.family='parlor'", "codec_lm"], {}),
    # train: model, tokenizer, monitor
    "tokenizer-missing": lambda w: (
        w.train("name=tok", f"model.tokenizer={w.tmp}/no-tokenizer"), ["model.tokenizer=", "no-tokenizer"], {}),
    "tokenizer-folder-without-files": lambda w: (
        w.train("name=tok2", f"model.tokenizer={w.tmp}/empty"), ["model.tokenizer=", "no tokenizer files"], {}),
    "init-from-missing": lambda w: (
        w.train("name=init1", f"model.init_from={w.tmp}/absent"), ["model.init_from=", "absent': no such folder"], {}),
    "init-from-without-weights": lambda w: (
        w.train("name=init2", f"model.init_from={w.tmp}/lm-no-weights"), ["model.init_from=", "lm-no-weights"], {}),
    "init-from-wrong-shapes": lambda w: (
        w.train("name=init3", f"model.init_from={w.tmp}/lm-wrong-shapes"), ["weights do not fit its config.json"],
        {}),
    "wandb-missing": lambda w: (
        w.train("name=wb", "monitor.wandb=true"), ["pip install 'voxrelay[wandb]'", "monitor.wandb=false"],
        {"PYTHONPATH": f"{w.tmp}/no-wandb"}),
    # status, synthesize, export, demo
    "status-of-no-folder": lambda w: (["status", "/no/such/folder"], ["/no/such/folder"], {}),
    "synthesize-unknown-voice": lambda w: (
        ["synthesize", w.run, "Hello.", "-o", f"{w.tmp}/a.wav", "--voice", "xx-nope"], ["'xx-nope'", "en-us"], {}),
    "synthesize-description-to-a-codes-only-family": lambda w: (
        ["synthesize", w.run, "Hello.", "-o", f"{w.tmp}/a.wav", "--description", "a calm voice"],
        ["model.family=codec_lm takes no description", "drop --description"], {}),
    "eval-texts-bad-jsonl": lambda w: (
        ["eval", w.run, "--texts", str(w.tmp / "bad.jsonl")], ["bad.jsonl line 2: unknown field(s) voice",
                                                              "id, text, speaker, description"], {}),
    "synthesize-not-a-run": lambda w: (
        ["synthesize", str(w.tmp / "empty"), "Hello.", "-o", f"{w.tmp}/a.wav"], ["empty is not a run folder"], {}),
    "synthesize-export-of-unknown-family": lambda w: (
        ["synthesize", str(w.tmp / "future"), "Hello.", "-o", f"{w.tmp}/a.wav"],
        ["'future_tts'", "known: causal_lm, codec_lm"], {}),
    "synthesize-missing-step": lambda w: (
        ["synthesize", w.run, "Hello.", "-o", f"{w.tmp}/a.wav", "--step", "99"],
        ["no checkpoint at step 99", "; it holds steps "], {}),
    "synthesize-not-wav": lambda w: (
        ["synthesize", w.run, "Hello.", "-o", f"{w.tmp}/a.mp3"], ["a.mp3' is not a .wav file path"], {}),
    "export-not-a-run": lambda w: (
        ["export", str(w.tmp / "empty"), "-o", f"{w.tmp}/exp"], ["empty is not a run folder"], {}),
    "export-missing-step": lambda w: (
        ["export", w.run, "-o", f"{w.tmp}/exp", "--step", "99"], ["no checkpoint at step 99", "; it holds steps "], {}),
    "demo-zero-steps": lambda w: (["demo", "--steps", "0", "--root", f"{w.tmp}/demo"], ["--steps"], {}),
    # every path and text argument: outputs under a file, inputs missing or empty (checked before any work)
    "demo-root-is-a-file": lambda w: (
        ["demo", "--steps", "1", "--root", f"{w.tmp}/notyaml.yaml"], ["notyaml.yaml is a file, not a folder"], {}),
    "train-root-under-a-file": lambda w: (
        w.train(f"root={w.tmp}/notyaml.yaml/root"), ["notyaml.yaml is a file, not a folder", "set `root`"], {}),
    "plan-config-missing": lambda w: (
        ["plan", f"{w.tmp}/absent.yaml"], ["absent.yaml' cannot be read: No such file or directory"], {}),
    "synthesize-output-under-a-file": lambda w: (
        ["synthesize", w.run, "Hello.", "-o", f"{w.tmp}/notyaml.yaml/a.wav"],
        ["notyaml.yaml is a file, not a folder", "pass another -o"], {}),
    "synthesize-empty-text": lambda w: (
        ["synthesize", w.run, "  ", "-o", f"{w.tmp}/a.wav"], ["the text to speak is empty"], {}),
    "synthesize-empty-script": lambda w: (
        ["synthesize", w.run, "--script", str(w.tmp / "empty.txt"), "-o", f"{w.tmp}/a.wav"],
        ["empty.txt' is empty"], {}),
    "synthesize-script-missing": lambda w: (
        ["synthesize", w.run, "--script", str(w.tmp / "absent.txt"), "-o", f"{w.tmp}/a.wav"],
        ["absent.txt' cannot be read"], {}),
    "eval-texts-missing": lambda w: (["eval", w.run, "--texts", str(w.tmp / "absent.txt")], ["absent.txt"], {}),
    "eval-texts-empty": lambda w: (["eval", w.run, "--texts", str(w.tmp / "empty.txt")], ["no texts in it"], {}),
    "export-output-is-a-file": lambda w: (
        ["export", w.run, "-o", f"{w.tmp}/notyaml.yaml"], ["notyaml.yaml is a file, not a folder"], {}),
    "export-output-under-a-file": lambda w: (
        ["export", w.run, "-o", f"{w.tmp}/notyaml.yaml/exp"], ["notyaml.yaml is a file, not a folder"], {}),
    "import-file-missing": lambda w: (
        ["import", "parler-config", str(w.tmp / "absent.json"), "-o", f"{w.tmp}/imported.yaml"], ["absent.json"], {}),
    "import-output-under-a-file": lambda w: (
        ["import", "parler-config", str(w.tmp / "bad.jsonl"), "-o", f"{w.tmp}/notyaml.yaml/c.yaml"],
        ["notyaml.yaml is a file, not a folder"], {}),
    "voices-not-a-run": lambda w: (["voices", str(w.tmp / "empty")], ["empty is neither a run folder"], {}),
}


def _message(stderr: str) -> str:
    """The error paragraph: from "error:" (ours) or else the "Error" title of a usage error's box, to the end."""
    at = stderr.find("error: ") if "error: " in stderr else stderr.find("─ Error ─")
    assert at >= 0, stderr
    return stderr[at:].strip()


# Messages not yet one paragraph; each has a strict xfail below that turns red once it is fixed.


@pytest.fixture(scope="module")
def batch(world: World) -> dict[str, dict]:
    """Every case without an environment of its own, run in one process: name -> returncode, stdout, stderr."""
    built = {name: case(world) for name, case in CASES.items()}
    commands = {name: args for name, (args, _, extra_env) in built.items() if not extra_env}
    res = subprocess.run([sys.executable, "-m", "tests.helpers.cli_batch"], input=json.dumps(commands),
                         env=world.env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout)


def _run_case(world: World, name: str, batch: dict[str, dict] | None = None) -> tuple[str, str]:
    """Run a case (its result in ``batch``, when there); returns (message, all output) after the checks every
    case passes."""
    args, expected, extra_env = CASES[name](world)
    if batch is not None and name in batch:
        res = SimpleNamespace(**batch[name])
    else:
        res = voxrelay(*args, env={**world.env, **extra_env}, timeout=300)
    out = res.stdout + res.stderr
    assert res.returncode == 2, out
    assert "Traceback" not in out
    message = _message(res.stderr)
    for text in expected:
        assert text in message, message
    return message, out


@pytest.mark.parametrize("name", list(CASES))
def test_user_error_exits_2_with_a_message(world: World, batch: dict[str, dict], name: str) -> None:
    message, _ = _run_case(world, name, batch)
    assert all(line.strip() for line in message.splitlines()), message  # one paragraph: no blank line


def test_the_world_is_not_broken(world: World) -> None:
    """The same commands with good input succeed: the cases above fail because of their bad part."""
    res = voxrelay("synthesize", world.run, "Hello.", "-o", f"{world.tmp}/ok.wav", "--voice", "en-us",
                   env=world.env, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert Path(res.stdout.strip().splitlines()[-1]) == world.tmp / "ok.wav"


def test_a_copied_root_works_from_any_working_directory(world: World, tmp_path: Path) -> None:
    """A run folder finds its prepared data from where it is, not from the root (or the directory) it was trained
    with: the root copied elsewhere, the original moved away, commands run from an unrelated directory."""
    copy = tmp_path / "copied-root"
    shutil.copytree(world.root, copy)
    away = Path(world.root).with_name("moved-away")
    Path(world.root).rename(away)
    try:
        run, cwd = "../copied-root/runs/demo", tmp_path / "elsewhere"
        cwd.mkdir()
        voices = voxrelay("voices", run, env=world.env, cwd=cwd)
        assert voices.returncode == 0 and voices.stdout.split() == ["en-gb+f3", "en-us"], voices.stdout + voices.stderr
        outs = {}
        for args in (["synthesize", run, "Hello.", "-o", "hello.wav"], ["eval", run, "--num", "1", "--json"],
                     ["export", run, "-o", "exported"]):
            res = voxrelay(*args, env=world.env, cwd=cwd)
            assert res.returncode == 0, res.stdout + res.stderr
            outs[args[0]] = res.stdout
            assert "Writing model shards" not in res.stderr  # transformers' progress bar, only with --verbose
        assert (cwd / "hello.wav").stat().st_size > 44 and (cwd / "exported" / "model.safetensors").exists()
        assert json.loads(outs["eval"].splitlines()[0])["step"] == 2  # the held-out text came from the copy
        assert (copy / "runs" / "demo" / "eval" / "results.jsonl").exists()  # and its results went there
    finally:
        away.rename(world.root)




# A disk that fills up while a command writes, and a read-only mount, as users meet them: a real tmpfs of a few
# pages and a real read-only mount, in a mount namespace of the command's own. The tmpfs: 16 pages, filled but
# for 2: the check's probe (one byte, one page) passes, an output of more than 8 KiB does not fit.
FULL_DISK = ('mount -t tmpfs -o size=64k tmpfs "$D" && (cat /dev/zero > "$D/filler" 2>/dev/null || true) '
             '&& truncate -s -8192 "$D/filler"')
needs_mounts = pytest.mark.skipif(not can_hide_folders(), reason="needs unshare and mount (root or user namespaces)")


def _one_error_line(output: str, *parts: str) -> None:
    """exit 2's one line: ``error: `` and ``parts`` (the option, the path, the errno's meaning); no traceback."""
    assert "Traceback" not in output, output
    lines = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and all(part in lines[0] for part in parts), output


@needs_mounts
def test_synthesize_onto_a_full_disk_is_exit_2_and_keeps_the_previous_take(world: World, tmp_path: Path) -> None:
    disk = tmp_path / "disk"
    disk.mkdir()
    take = disk / "take.wav"  # 0.7 s of audio, 22 KB
    setup = f'D="{disk}"; {FULL_DISK} && printf "the previous take" > "{take}"'
    code, output, after = in_mount_namespace(setup, ["synthesize", world.run, "Hello.", "-o", str(take)],
                                             world.env, tmp_path / "log", after=f'cat "{take}"; echo; ls -A "{disk}"')
    assert code == 2, output
    _one_error_line(output, "-o", str(take), "No space left on device", "make room")
    assert after.split() == ["the", "previous", "take", "filler", "take.wav"], after  # replaced only when complete


@needs_mounts
def test_export_onto_a_full_disk_is_exit_2_naming_its_folder(world: World, tmp_path: Path) -> None:
    disk = tmp_path / "disk"
    disk.mkdir()
    code, output, after = in_mount_namespace(f'D="{disk}"; {FULL_DISK}', ["export", world.run, "-o", str(disk / "e")],
                                             world.env, tmp_path / "log", after=f'ls -A "{disk}/e"')
    assert code == 2, output
    _one_error_line(output, "-o", str(disk / "e"), "No space left on device")
    assert "config.json" in after.split(), after  # what was written before the disk filled stays


@needs_mounts
def test_a_read_only_mount_is_refused_before_the_model_loads(world: World, tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    out = ro / "missing" / "exp"  # os.access said "not writable by this user", not why
    code, output, _ = in_mount_namespace(f'mount -t tmpfs -o ro tmpfs "{ro}"', ["export", world.run, "-o", str(out)],
                                         world.env, tmp_path / "log")
    assert code == 2, output
    _one_error_line(output, "-o", str(out), "Read-only file system")
    # eval writes into the run folder: a run on a read-only mount is refused before minutes of scoring
    setup = f'mount --bind "{world.run}" "{world.run}" && mount -o remount,bind,ro "{world.run}"'
    code, output, _ = in_mount_namespace(setup, ["eval", world.run], world.env, tmp_path / "log2")
    assert code == 2 and "evaluating" not in output, output
    _one_error_line(output, "RUN", world.run, "Read-only file system")
