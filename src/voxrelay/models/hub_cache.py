"""Pretrained models (T5, DAC, SNAC, base LMs, tokenizers) cached in the bucket, ``cache.models_uri``.

The Hugging Face hub cache of a voxrelay process is ``$VOXRELAY_CACHE/hf-hub`` (unless ``HF_HUB_CACHE`` or
``HF_HOME`` is set), not ``~/.cache/huggingface`` on a small root disk. Before a run builds its model,
:func:`restore` copies the repos its config names (``org/name`` values) from the bucket into that cache, many
files at once, so ``from_pretrained("org/name")`` finds them without the hub or a slow mount. After the model
is built, :func:`publish` uploads every repo the session downloaded and the bucket lacks: the first session pays
the hub, the later ones copy from the bucket.

Layout: ``<models_uri>/models--org--name/refs/<revision>`` and ``.../snapshots/<commit>/<files>`` (the hub
cache's own layout, symlinks resolved), then ``.../snapshots/<commit>.complete`` written last (the commit
marker: a snapshot without it is ignored and uploaded again).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from voxrelay import storage
from voxrelay.paths import cache_dir

log = logging.getLogger(__name__)
THREADS = 8
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
MARKER = ".complete"


def use_local_hub_cache() -> None:
    """Point the hub cache at ``$VOXRELAY_CACHE/hf-hub`` unless the user chose one (before huggingface_hub is
    imported: it reads the variables once)."""
    if not (os.environ.get("HF_HUB_CACHE") or os.environ.get("HF_HOME")):
        os.environ["HF_HUB_CACHE"] = str(cache_dir("hf-hub"))


def hub_cache() -> Path:
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def repo_folder(repo_id: str) -> str:
    return "models--" + repo_id.replace("/", "--")


def hub_ids(config: dict) -> list[str]:
    """The ``org/name`` strings among a config's values that are not local folders (what from_pretrained
    would fetch from the hub)."""
    found: list[str] = []

    def walk(value) -> None:
        if isinstance(value, dict):
            for v in value.values():
                walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)
        elif isinstance(value, str) and HUB_ID.match(value) and not Path(value).exists() and value not in found:
            found.append(value)

    walk(config)
    return found


def _copy_all(pairs: Iterable[tuple], fn) -> int:
    pairs = list(pairs)
    with ThreadPoolExecutor(THREADS) as pool:
        list(pool.map(lambda p: fn(*p), pairs))
    return len(pairs)


def committed_repos(models_uri: str) -> list[str]:
    """The repos with a committed snapshot under ``models_uri``."""
    out = []
    for name in storage.listdir(models_uri) if storage.exists(models_uri) else []:
        snaps = storage.join(models_uri, name, "snapshots")
        if name.startswith("models--") and storage.exists(snaps) and \
                any(n.endswith(MARKER) for n in storage.listdir(snaps)):
            out.append(name[len("models--"):].replace("--", "/"))
    return out


def restore(models_uri: str, repo_ids: list[str]) -> list[str]:
    """Copy the committed snapshots of ``repo_ids`` from the bucket into the local hub cache (files already there
    with the same size are kept); the repos restored."""
    done = []
    for repo in repo_ids:
        base = storage.join(models_uri, repo_folder(repo))
        snaps = storage.join(base, "snapshots")
        if not storage.exists(snaps):
            continue
        committed = [n[: -len(MARKER)] for n in storage.listdir(snaps) if n.endswith(MARKER)]
        if not committed:
            continue
        local = hub_cache() / repo_folder(repo)
        wanted = []
        for commit in committed:
            folder = storage.checked_join(local / "snapshots", commit, f"the listing of {snaps}", single=True)
            sizes = storage.tree_sizes(storage.join(snaps, commit))
            for rel, size in sizes.items():  # object keys: whoever writes the bucket chooses them
                target = storage.checked_join(folder, rel, f"the listing of {storage.join(snaps, commit)}")
                if not (target.exists() and target.stat().st_size == size):
                    wanted.append((storage.join(snaps, commit, rel), target))
        refs = storage.join(base, "refs")
        if storage.exists(refs):
            wanted += [(storage.join(refs, n), storage.checked_join(local / "refs", n, f"the listing of {refs}", True))
                       for n in storage.file_sizes(refs)]
        for _, target in wanted:
            target.parent.mkdir(parents=True, exist_ok=True)
        count = _copy_all(wanted, lambda uri, target: storage.get_file(uri, target))
        log.info("pretrained %s: %d files copied from %s", repo, count, base)
        done.append(repo)
    return done


def publish(models_uri: str, repo_ids: list[str]) -> list[str]:
    """Upload the local hub cache's snapshots of ``repo_ids`` that the bucket has not committed (files first, the
    marker last); the ``repo@commit`` uploaded."""
    out = []
    root = hub_cache()
    for repo in [root / repo_folder(r) for r in repo_ids if (root / repo_folder(r)).is_dir()]:
        for snap in sorted((repo / "snapshots").glob("*")) if (repo / "snapshots").exists() else []:
            if not snap.is_dir():
                continue
            remote = storage.join(models_uri, repo.name, "snapshots", snap.name)
            if storage.exists(remote + MARKER):
                continue
            files = [p for p in snap.rglob("*") if p.is_file()]  # symlinks to blobs resolve to their content
            _copy_all([(p, storage.join(remote, p.relative_to(snap).as_posix())) for p in files],
                      lambda path, uri: storage.put_file(path.resolve(), uri))
            for ref in (repo / "refs").glob("*") if (repo / "refs").exists() else []:
                if ref.is_file():
                    storage.write_text(storage.join(models_uri, repo.name, "refs", ref.name), ref.read_text())
            storage.write_text(remote + MARKER, "")
            name = repo.name[len("models--"):].replace("--", "/")
            log.info("pretrained %s@%s: %d files cached in %s for later sessions", name, snap.name[:8], len(files),
                     models_uri)
            out.append(f"{name}@{snap.name}")
    return out


def local_repos() -> list[str]:
    """The repos in the local hub cache."""
    root = hub_cache()
    return [p.name[len("models--"):].replace("--", "/") for p in sorted(root.glob("models--*"))] if root.exists() \
        else []


def config_hub_ids(cfg) -> list[str]:
    """The hub repos a run config names (its model and codec sections)."""
    return hub_ids({"model": cfg.model.model_dump(mode="json"), "codec": cfg.codec.model_dump(mode="json")})


def from_bucket(cfg, copies: bool = True, barrier=lambda: None) -> None:
    """The repos committed in ``cache.models_uri`` (those the root's runs have used), copied into the local hub
    cache by one process per machine (``copies``; the others wait at ``barrier``). The bucket unreachable: the hub
    is used instead."""
    refused = None
    if cfg.models_uri is not None and copies:
        try:
            restore(cfg.models_uri, committed_repos(cfg.models_uri))  # what this root's runs have used
        except storage.OutsideRoot as err:  # a planted name: the bucket is not to be trusted, not unreachable
            refused = err
        except (storage.StorageError, OSError) as err:
            log.warning("pretrained models could not be copied from %s (%s); they come from the hub",
                        cfg.models_uri, str(err).split("\n")[0][:200])
    barrier()  # reached by every process, refused or not: none waits here for one that stopped
    if refused is not None:
        raise refused


def to_bucket(cfg) -> None:
    """Upload to ``cache.models_uri`` the hub snapshots this machine has and the bucket lacks: every repo of
    voxrelay's own hub cache, or the config's repos when ``HF_HOME``/``HF_HUB_CACHE`` point at the user's own
    (never fatal)."""
    if cfg.models_uri is None:
        return
    try:
        own = hub_cache() == cache_dir("hf-hub")  # voxrelay's own cache: every repo in it came for a run
        publish(cfg.models_uri, local_repos() if own else config_hub_ids(cfg))
    except (storage.StorageError, OSError) as err:
        log.warning("pretrained models could not be cached in %s (%s); the next session downloads them again",
                    cfg.models_uri, str(err).split("\n")[0][:200])
