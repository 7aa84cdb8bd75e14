"""`prepare` when every source is gone but the data is prepared: the second session of a notebook or a spot
job, whose raw folder was on the first machine's disk while the prepared data is in the bucket. The templates
run `prepare` first in every session, so this is not an error: the committed data is what `train` will read,
provided this config asks for the data it holds (compared through the committed index's identity, as far as
the config alone tells: without the sources, other parameters could not be prepared)."""

from __future__ import annotations

from voxrelay import storage
from voxrelay.config import RunConfig
from voxrelay.data import identity as ident
from voxrelay.data import shards as sh
from voxrelay.data.sources import SourceError
from voxrelay.data.types import PrepareReport


class SourcesGone(SourceError):
    """Every source of the config is missing (``missing``: one message per source)."""

    def __init__(self, missing: list[str]):
        super().__init__("; ".join(missing))
        self.missing = missing


def committed_without_sources(cfg: RunConfig, gone: SourcesGone, rank: int) -> PrepareReport:
    """The report of the committed data at ``cfg.prepared_uri``; raises ``gone`` when nothing is committed there,
    and a :class:`~voxrelay.data.shards.PrepareError` when this config asks for other parameters."""
    prepared = cfg.prepared_uri
    index_uri = storage.join(prepared, sh.INDEX_FILE)
    if not storage.exists(index_uri):
        raise SourceError(f"{gone}; nothing is prepared at {prepared} yet either: make the source available here "
                          "(or change data.sources) and run prepare") from None
    index = storage.read_json(index_uri)
    committed = index.get("identity", {}).get("params")
    changed = ident.config_changes(cfg, committed) if committed is not None else []
    if changed:
        raise sh.PrepareError(
            f"{gone}; the data prepared from it at {prepared} was made with other parameters ({', '.join(changed)}) "
            "and cannot be prepared again without the sources: make them available here, or restore the values "
            "to train on the prepared data as it is")
    if rank != 0:
        return PrepareReport(prepared, {}, 0.0)
    note = (f"the sources are not here ({gone}); the data prepared from them is committed at {prepared} "
            f"(index.json of {index.get('created', 'an older voxrelay')}) and is used as it is; to prepare it "
            "again, make the sources available")
    return PrepareReport(prepared, index["counts"], index.get("hours", 0.0), [], len(index.get("shards", [])), 0,
                         note=note)
