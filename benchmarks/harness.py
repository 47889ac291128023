"""What the benchmarks and studies share: the repository's paths, a short ``megatron-rl train``
run and the metrics it writes (``metrics.jsonl``, ``summary.json``), the phases a step is timed
in, the machine a number was measured on, and stored results that may be gzip-compressed.

Used by run_all, rl_vs_trl (and its report), time_split, weight_sync, demo_ab, demo_profile,
memory, long_context_cp, sandbox_ab and every study. Standard library only at import, so any
script can import it cheaply. The library (``megatron_rl``, ``long_context``, ``domains``)
never imports benchmarks.
"""

from __future__ import annotations

import gzip
import json
import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]  # the repository
OUT = ROOT / "benchmarks" / "out"  # scratch output of the benchmarks (git-ignored)
DEMO_CONFIG = ROOT / "configs" / "demo_cpu.yaml"
PINNED_DEMO = ROOT / "benchmarks" / "configs" / "demo_cpu_2026-12-01.yaml"  # the demo, 2026-12-01
# the phases of an RL step the loop times (``time/<phase>_s`` in metrics.jsonl)
PHASES = ("generate", "score", "train", "sync", "log", "checkpoint", "eval", "other")


def train(config: str | Path, overrides: list[str], timeout: float | None = None) -> None:
    """``megatron-rl train CONFIG OVERRIDES...`` as a user runs it, from the repository root
    (raises if it fails or runs past ``timeout`` seconds); its numbers are in the run folder."""
    cli = [str(Path(sys.executable).parent / "megatron-rl"), "train", str(config)]
    subprocess.run([*cli, *overrides], check=True, cwd=ROOT, timeout=timeout)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The rows of a JSONL file such as a run's ``metrics.jsonl`` (blank lines skipped)."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def step_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows of metrics.jsonl that are training steps (those with ``time/step_s``)."""
    return [r for r in rows if "time/step_s" in r]


def read_summary(run: Path) -> dict[str, Any]:
    """A run folder's ``summary.json`` (held-out accuracy before/after, wall time, ...)."""
    return dict(json.loads((Path(run) / "summary.json").read_text()))


def rel(path: str) -> str:
    """A model path relative to the repository when it lies inside it."""
    p = Path(path).resolve()
    return str(p.relative_to(ROOT)) if ROOT in p.parents else path


def git_revision() -> str | None:
    """This tree's commit (``-dirty`` with uncommitted changes); None outside a git checkout."""
    try:
        out = subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=12"], cwd=ROOT,
                             capture_output=True, text=True, timeout=30)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() or None


def machine() -> dict[str, Any]:
    """What a number was measured on: cores, the 1-minute load average now, Python, torch and
    the git revision of this tree."""
    try:
        torch = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch = None
    return {
        "cores": os.cpu_count(),
        "load_avg_1m": os.getloadavg()[0],
        "python": platform.python_version(),
        "torch": torch,
        "git": git_revision(),
    }


def stem(path: Path) -> str:
    """A results file's name without its suffixes (``a.json`` and ``a.json.gz`` -> ``a``)."""
    return Path(Path(path).name.removesuffix(".gz")).stem


def read_text(path: Path) -> str:
    """The text of a stored result, gunzipped when its name ends in ``.gz``."""
    path = Path(path)
    return gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()


def to_bytes(path: Path, text: str) -> bytes:
    """``text`` as stored at ``path``: gzip with no name and time 0 when the name ends in
    ``.gz`` (the same text always gives the same bytes), else UTF-8."""
    data = text.encode()
    return gzip.compress(data, compresslevel=9, mtime=0) if Path(path).suffix == ".gz" else data


def write_text(path: Path, text: str) -> None:
    """Store ``text`` at ``path`` (gzip when its name ends in ``.gz``, see ``to_bytes``)."""
    Path(path).write_bytes(to_bytes(path, text))
