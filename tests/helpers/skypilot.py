"""Check a SkyPilot task file the way ``sky.Task.from_yaml`` does on the client, with SkyPilot's own schemas
(exported by scripts/skypilot_schema.py into skypilot_schema.json beside this file; SkyPilot itself cannot be
installed beside voxrelay, see that script).

The steps, as SkyPilot takes them: top-level keys set to null are dropped and ``envs`` values read as strings;
the task is validated against the task schema and its ``resources:`` against the resources schema; both with a
Draft 7 validator that knows SkyPilot's one extra keyword, ``case_insensitive_enum``. One check is ours: the
job_recovery strategy must be a registered one (SkyPilot only finds out on the controller, after the launch).
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

SCHEMA_FILE = Path(__file__).with_name("skypilot_schema.json")


@cache
def exported() -> dict[str, Any]:
    return json.loads(SCHEMA_FILE.read_text())


@cache
def _validator_class():
    import jsonschema

    def case_insensitive_enum(validator, enums, instance, schema):  # noqa: ANN001 (jsonschema's signature)
        if not isinstance(instance, str) or instance.lower() not in {e.lower() for e in enums}:
            yield jsonschema.ValidationError(f"{instance!r} is not one of {enums!r} (in any case)")

    return jsonschema.validators.extend(jsonschema.Draft7Validator, {"case_insensitive_enum": case_insensitive_enum})


def _errors(schema: dict[str, Any], obj: Any, what: str) -> list[str]:
    from jsonschema.exceptions import best_match

    found = sorted(_validator_class()(schema).iter_errors(obj), key=lambda e: list(e.absolute_path))
    found = [best_match([e]) for e in found]  # anyOf: the deepest error of the branch that fits best
    return [f"{what}: {'.'.join(map(str, e.absolute_path)) or '(top level)'}: {e.message}" for e in found]


def task_errors(task: dict[str, Any]) -> list[str]:
    """Every problem SkyPilot's schemas find in a task (a task file's YAML, loaded); [] when there is none."""
    task = {k: v for k, v in task.items() if v is not None}
    if isinstance(task.get("envs"), dict):
        task["envs"] = {str(k): None if v is None else str(v) for k, v in task["envs"].items()}
    errors = _errors(exported()["task"], task, "task")
    resources = task.get("resources") or {}
    errors += _errors(exported()["resources"], resources, "resources")
    for option in [resources, *resources.get("any_of", []), *resources.get("ordered", [])]:
        recovery = option.get("job_recovery") if isinstance(option, dict) else None
        strategy = recovery.get("strategy") if isinstance(recovery, dict) else recovery
        if isinstance(strategy, str) and strategy.lower() not in exported()["job_recovery_strategies"]:
            errors.append(f"resources: job_recovery.strategy {strategy!r} is not one of "
                          f"{exported()['job_recovery_strategies']} (in any case)")
    return errors
