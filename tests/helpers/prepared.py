"""The tiny corpus (the data of :mod:`tests.helpers.tiny`), prepared once per test run and copied into a test's
own root and cache in milliseconds.

Preparing it (the demo's eSpeak voices, the built-in codec's k-means) takes a second or more of a core; dozens of
tests need it unchanged. :func:`corpus` prepares it once per run, under a file lock in the folder every pytest-xdist
worker of the run shares (the first worker prepares, the others wait and reuse it); :func:`prepared_config` copies
it into a test's ``root`` and ``VOXRELAY_CACHE`` and still runs the real ``prepare``, which finds the data up to
date (or prepares it again when the test's overrides change the data: nothing is assumed)."""

from __future__ import annotations

import fcntl
import shutil
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest

from tests.helpers.runner import CONFIG
from tests.helpers.tiny import tiny

READY = "READY"


def corpus(shared: Path) -> Path:
    """A folder holding ``root/`` (the tiny config's prepared data) and ``cache/`` (its generated sources), made by
    the first caller of the run; the others wait for it on the lock."""
    folder = shared / "tiny-corpus"
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also if this process dies
        if not (folder / READY).exists():
            _prepare(folder)
            (folder / READY).write_text("")
    return folder


def _prepare(folder: Path) -> None:
    from voxrelay.config import load_config
    from voxrelay.data.prepare import prepare

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VOXRELAY_CACHE", str(folder / "cache"))
        prepare(load_config(CONFIG, tiny(str(folder / "root"))))


def prepared_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shared: Path, *overrides: str,
                    config: str = CONFIG):
    """The tiny config (plus ``overrides``) at ``tmp_path/root``, its data prepared: the run's corpus copied in,
    then ``prepare`` run as a user would (a no-op check when the data is the corpus's)."""
    from voxrelay.config import load_config
    from voxrelay.data.prepare import prepare

    copy_corpus(shared, tmp_path)
    monkeypatch.setenv("VOXRELAY_CACHE", str(tmp_path / "cache"))
    cfg = load_config(config, tiny(str(tmp_path / "root"), *overrides))
    prepare(cfg)
    return cfg


def copy_corpus(shared: Path, base: Path) -> Path:
    """``base`` holding the run's tiny corpus as ``root/`` (prepared) and ``cache/`` (its sources): a module's
    prepared root in milliseconds, for tests that train through the CLI with ``env_for(base / "cache")``."""
    made = corpus(shared)
    for part in ("root", "cache"):
        shutil.copytree(made / part, base / part, dirs_exist_ok=True)
    return base


class Synthetic(NamedTuple):
    index: dict  # what index.json holds
    sizes: dict[str, int]  # shard name -> bytes written


def synthetic(uri: str, *, train: int = 2, eval: int = 0, rows: int = 3, codebooks: int = 2, seed: int = 0,
              varied: bool = False, row_index: bool = False) -> Synthetic:
    """Prepared data written straight from random codes, in milliseconds (no audio, no codec): ``train`` and
    ``eval`` shards of ``rows`` rows each, ``codebooks`` codebooks of values < 1000. ``varied``: each row's text,
    duration and length (20-299 frames) drawn, speakers ``spk0..2`` (a row's first has none); else "text", 1 s and
    400 incompressible frames. ``row_index``: the train split's row index sidecar written, as prepare does."""
    from voxrelay import storage
    from voxrelay.data import rowindex as ri
    from voxrelay.data import shards as sh

    rng = np.random.default_rng(seed)
    index: dict = {"num_codebooks": codebooks, "shards": []}
    sizes, metas = {}, []
    for n in range(train + eval):
        split = "train" if n < train else "eval"
        name = f"{split}-{n:05d}"
        utts = [_row(rng, f"{seed}-{n}-{i}" if not varied else f"s{n}-r{i}", n, i, codebooks, varied)
                for i in range(rows)]
        data = sh.encode_table(utts)
        storage.write_bytes(sh.shard_uri(uri, name), data)
        index["shards"].append({"name": name, "split": split})
        sizes[name] = len(data)
        if split == "train":
            metas.append(ri.row_meta(utts))
    if varied:
        index["identity"] = {"x": 1}
    if row_index:
        index["row_index"] = {"train": ri.write_row_index(uri, "train", metas)}
    storage.write_json(storage.join(uri, sh.INDEX_FILE), index)
    return Synthetic(index, sizes)


def _row(rng: np.random.Generator, row_id: str, n: int, i: int, codebooks: int, varied: bool):
    from voxrelay.data.shards import EncodedUtterance

    if not varied:
        codes = rng.integers(0, 1000, (codebooks, 400), dtype=np.int16)
        return EncodedUtterance(row_id, "text", None, None, 1.0, codes)
    text = "word " * int(rng.integers(1, 9))
    seconds = float(rng.uniform(0.5, 4.0))
    frames = int(rng.integers(20, 300))
    return EncodedUtterance(row_id, text, f"spk{(n + i) % 3}" if i else None, None, seconds,
                            rng.integers(0, 1000, (codebooks, frames), dtype=np.int16))
