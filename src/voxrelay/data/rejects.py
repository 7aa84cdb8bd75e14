"""The rows ``prepare`` rejected: every one in ``rejects.jsonl``, the first :data:`LISTED` on the terminal with
the most common reasons counted, and the gate that stops a prepare that kept no training row, or whose
rejection rate is above ``data.max_reject_fraction`` (a systematic cause, not a few bad files), before
``index.json`` commits a sliver of the data for `train`.

A reject is ``{"id", "where", "reason"}``; ``where`` names the file and row (``<file> row N`` / ``line N``).
"""

from __future__ import annotations

import json
import math
import os
import re

from voxrelay import storage
from voxrelay.data.shards import REJECTS_FILE

LISTED = 30  # rejects listed on the terminal; all of them are in rejects.jsonl
REASONS = 5  # distinct reasons counted on the terminal
# the parts of a reason that differ from row to row: quoted values, paths, numbers
_VARYING = re.compile(r"'[^']*'|\"[^\"]*\"|\S*/\S*|\d+(?:\.\d+)?")


def write(prepared_uri: str, rejects: list[dict]) -> None:
    """``<prepared>/rejects.jsonl``: every reject of the last prepare, one JSON object per line (not rewritten
    when unchanged: a prepare that changes nothing writes nothing)."""
    uri, text = storage.join(prepared_uri, REJECTS_FILE), "".join(json.dumps(r) + "\n" for r in rejects)
    if not storage.exists(uri) or storage.read_text(uri) != text:
        storage.write_text(uri, text)


def counted_reasons(rejects: list[dict], top: int = REASONS) -> list[str]:
    """``"13 × <reason>"`` for the ``top`` most common reasons, most common first; reasons that differ only in a
    value, a path or a number count as one (``"4 × <the first of them> (and 3 like it)"``)."""
    groups: dict[str, list[str]] = {}
    for r in rejects:
        groups.setdefault(_VARYING.sub("…", r["reason"]), []).append(r["reason"])
    ranked = sorted(groups.values(), key=len, reverse=True)  # stable: ties keep the order met
    lines = [f"{len(g)} × {g[0]}" + ("" if len(set(g)) == 1 else f" (and {len(g) - 1} like it)") for g in ranked[:top]]
    if len(ranked) > top:
        lines.append(f"... and {sum(len(g) for g in ranked[top:])} rows for {len(ranked) - top} other reasons")
    return lines


def format_rejects(rejects: list[dict], prepared_uri: str, limit: int = LISTED, counted: bool = True) -> list[str]:
    """A header and one ``file:row id: reason`` line per reject (the first ``limit``), file paths relative to
    the folder the sources share; with ``counted``, the reasons counted when not every reject is listed."""
    rejects = sorted(rejects, key=_place)  # in the order of the files and their rows (shards mix them)
    where = [re.match(r"^(.*) (?:row|line) (\d+)$", r["where"]) for r in rejects]
    files = [m.group(1) for m in where if m and (os.path.isabs(m.group(1)) or storage.is_uri(m.group(1)))]
    base = _common_folder(files)
    rows = f"{len(rejects)} rejected row{'s' if len(rejects) != 1 else ''}"
    lines = [f"{rows} (all in {storage.join(prepared_uri, REJECTS_FILE)})" + (f"; paths relative to {base}:" if base
                                                                                else ":")]
    for r, m in zip(rejects[:limit], where, strict=False):
        place = r["where"]
        if m:
            path = m.group(1)[len(base) + 1:] if base and m.group(1).startswith(base + "/") else m.group(1)
            place = f"{path}:{m.group(2)}"
        lines.append(f"  {place} {r['id']}: {r['reason']}")
    if len(rejects) > limit:
        lines.append(f"  ... and {len(rejects) - limit} more" + ("; the most common reasons:" if counted else ""))
        lines += [f"  {line}" for line in counted_reasons(rejects)] if counted else []
    return lines


def _place(reject: dict) -> tuple[str, int]:
    found = re.match(r"^(.*) (?:row|line) (\d+)$", reject["where"])
    return (found.group(1), int(found.group(2))) if found else (reject["where"], 0)


def _common_folder(files: list[str]) -> str:
    """The deepest folder holding every one of ``files`` (local paths or URIs), "" when none."""
    if not files:
        return ""
    parts = [f.split("/")[:-1] for f in files]  # the folders (a URI's "scheme:" and "" parts included)
    common = []
    for names in zip(*parts, strict=False):
        if len(set(names)) > 1:
            break
        common.append(names[0])
    folder = "/".join(common)
    return "" if folder in ("", "/") or folder.endswith(":/") or folder.endswith(":") else folder


def gate(counts: dict[str, int], rejects: list[dict], max_fraction: float, eval_size: int) -> str | None:
    """Why the prepared rows must not be committed, or None: no training row, or too many rejects."""
    kept = counts.get("train", 0) + counts.get("eval", 0)
    total = kept + len(rejects)
    if kept == 0:
        return f"prepare kept no row: {len(rejects)} of {total} rows rejected"
    if counts.get("train", 0) == 0:
        rejected = f"{len(rejects)} of {total} rows were rejected" if rejects else "none was rejected"
        return (f"prepare kept no training row: the {kept} usable rows all went to the eval split (data.eval_size="
                f"{eval_size}), and {rejected}; lower data.eval_size or add rows")
    rate = len(rejects) / total
    if rate > max_fraction:
        accept = math.ceil(rate * 100) / 100
        return (f"{len(rejects)} of {total} rows rejected ({rate:.0%}), more than data.max_reject_fraction="
                f"{max_fraction:g}: so many usually share one cause (a column, a path, a transcript format, a "
                f"duration bound). Fix it and run prepare again (the {kept} good rows are kept and not encoded "
                f"again), or accept this rate with data.max_reject_fraction={accept:g}; until then no index.json is "
                "written, so `train` does not start on the rest")
    return None


def stop_message(headline: str, rejects: list[dict], prepared_uri: str) -> str:
    """The message of a prepare that stops on its rejects: the headline, the reasons counted, the first rows (the
    headline alone when no row was rejected: every row went to the eval split)."""
    if not rejects:
        return headline
    lines = [f"{headline}. Most common reasons:", *(f"  {line}" for line in counted_reasons(rejects))]
    return "\n".join(lines + format_rejects(rejects, prepared_uri, counted=False))
