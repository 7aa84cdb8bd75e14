"""What this process asked of storage: billed operations by class and bytes moved (``voxrelay status --cost``).

Object stores bill requests in two classes (GCS: https://cloud.google.com/storage/pricing#operations-by-class;
S3 and R2 alike):

* class A, the writes and listings: an object written (insert, PUT, a conditional write), a listing;
* class B, the reads: an object read or downloaded, an object's or a bucket's metadata (exists, size).

Deletes are free on GCS and S3 and are not counted (a recursive delete lists first: one class A). One call
of :mod:`voxrelay.storage` counts as one request; what a client does underneath is not seen: a retried
request, a big upload split into parts (a multipart or resumable upload bills a few more), an ``exists``
that lists a folder. A local root counts as a bucket would (a gcsfuse mount turns each call into such
requests); the cost estimate prices it unless its prices are set to 0.

Counts are per process, from its start, and thread-safe (uploads and metric syncs run in threads). The
trainer adds up its processes' counts and keeps them per session in ``<run>/usage.json``
(:mod:`voxrelay.cost.usage`).
"""

from __future__ import annotations

import threading

CLASS_A, CLASS_B = "class_a", "class_b"
BYTES_READ, BYTES_WRITTEN = "bytes_read", "bytes_written"
KEYS = (CLASS_A, CLASS_B, BYTES_READ, BYTES_WRITTEN)

_lock = threading.Lock()
_counts = dict.fromkeys(KEYS, 0)


def count(op: str, read: int = 0, written: int = 0) -> None:
    """One request of class ``op`` (:data:`CLASS_A` or :data:`CLASS_B`) that moved ``read``/``written`` bytes."""
    with _lock:
        _counts[op] += 1
        _counts[BYTES_READ] += read
        _counts[BYTES_WRITTEN] += written


def op_counts() -> dict[str, int]:
    """This process's counts so far: ``class_a``, ``class_b`` (requests), ``bytes_read``, ``bytes_written``."""
    with _lock:
        return dict(_counts)
