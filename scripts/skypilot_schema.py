"""Export SkyPilot's own task-YAML schemas to tests/helpers/skypilot_schema.json, which the tests check
examples/skypilot*.yaml against.

SkyPilot cannot be installed beside voxrelay (it requires click<8.2; huggingface_hub, which transformers needs,
requires click>=8.4.2), so it runs in a virtualenv of its own, here only:

    python3 -m venv /tmp/sky && /tmp/sky/bin/pip install skypilot==0.14.1
    /tmp/sky/bin/python scripts/skypilot_schema.py

What it exports is what ``sky.Task.from_yaml`` (run by ``sky jobs launch``) validates a task file with, on the
client: the task schema (``sky.utils.schemas.get_task_schema``), the resources schema that the ``resources:``
section is validated with separately (``get_resources_schema``), and the registered job_recovery strategies.
``VOXRELAY_SKYPILOT_PYTHON=/tmp/sky/bin/python`` makes the tests also run ``sky.Task.from_yaml`` itself.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

OUT = Path(__file__).parents[1] / "tests" / "helpers" / "skypilot_schema.json"


def main() -> None:
    try:
        import sky
        from sky.utils import registry, schemas
    except ImportError as err:
        sys.exit(f"run this with a Python that has skypilot installed (see its docstring): {err}")
    exported = {
        "skypilot": sky.__version__,
        "task": schemas.get_task_schema(),
        "resources": schemas.get_resources_schema(),
        "job_recovery_strategies": sorted(registry.JOBS_RECOVERY_STRATEGY_REGISTRY.keys()),
    }
    OUT.write_text(json.dumps(exported, indent=1, sort_keys=True) + "\n")
    print(f"{OUT}: SkyPilot {sky.__version__}")


if __name__ == "__main__":
    main()
