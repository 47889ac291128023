"""Task sets shipped as JSONL files in ``domains/tasksets/`` (no code; see docs/domains.md).

Each ``*.jsonl`` file there becomes one or more domains (``tasks/<file stem>`` unless its lines
name a ``domain``), exactly as a user's own files passed through ``domains.task_files`` do.
"""

from __future__ import annotations

from pathlib import Path

from megatron_rl.domains.base import Domain
from megatron_rl.domains.jsonl import domains_from_files

TASKSET_DIR = Path(__file__).parent / "tasksets"


def domains() -> list[Domain]:
    return domains_from_files(str(p) for p in sorted(TASKSET_DIR.glob("*.jsonl")))
