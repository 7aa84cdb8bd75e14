"""``voxrelay doctor``: the storage, cost and machine traps of a run's setup, each as a verdict with its fix.

Checks (each in :mod:`voxrelay.doctor.checks` or :mod:`voxrelay.doctor.host_checks`, pure functions of
the facts that :mod:`voxrelay.doctor.facts` and :mod:`voxrelay.doctor.cloud` gather):

* bucket location vs the machine's region (GCE/Colab metadata server zone, AWS IMDS region);
* multi-/dual-region bucket (replication charges on every byte written), S3 replication rules;
* GCS soft-delete retention; object versioning keeping every deleted checkpoint;
* storage classes with a minimum storage duration; lifecycle rules that delete or move the run's objects;
* read/write throughput to the root (a probe object, deleted after);
* a root on a mounted folder (gcsfuse, Google Drive); the root's conditional create (a run's lease rests on
  it: an object created twice, the second refused); free local disk; where the Hugging Face cache points;
* the GPU's memory vs what ``voxrelay plan`` predicts for the config's strategy.

Verdicts: ``ok``; ``warn`` (costs or slows in some cases, worth a look); ``fail`` (costs money or loses work
on every session until fixed); ``skip`` (does not apply here, or could not be told: the row says why).
``voxrelay doctor`` exits 1 when a check fails, else 0.
"""

from __future__ import annotations

from dataclasses import dataclass

OK, WARN, FAIL, SKIP = "ok", "warn", "fail", "skip"
VERDICTS = (OK, WARN, FAIL, SKIP)
EXIT_FAILED = 1  # `voxrelay doctor`: at least one check failed


@dataclass(frozen=True)
class Check:
    """One check's outcome: ``verdict`` (ok / warn / fail / skip), what was ``found``, and the ``fix``
    (empty when there is nothing to do)."""

    name: str
    verdict: str
    found: str
    fix: str = ""


def exit_code(checks: list[Check]) -> int:
    """:data:`EXIT_FAILED` when any check failed, else 0 (warnings and skips do not fail the command)."""
    return EXIT_FAILED if any(c.verdict == FAIL for c in checks) else 0
