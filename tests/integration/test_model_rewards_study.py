"""The model-reward study (benchmarks/studies/model_rewards.py): its quick mode runs a part end
to end (every arm, one seed, four steps) into a scratch file and its statistics recompute; the
stored study's statistics recompute from its runs. No timing is asserted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from benchmarks.studies import model_rewards as mr
from benchmarks.studies.model_rewards_stats import CONSTRAINT
from benchmarks.studies.stored_runs import read

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, check=False
    )


def test_quick_constraint_part_runs_every_arm_and_recomputes(tmp_path) -> None:
    out = tmp_path / "quick.json.gz"
    proc = _run(
        "benchmarks.studies.model_rewards",
        "--part=constraint",
        "--quick",
        f"--json={out}",
        f"--run-dir={tmp_path / 'runs'}",
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = read(out)
    runs = doc["sections"]["constraint"]["runs"]
    assert set(runs) == set(mr.PARTS["constraint"]["arms"])
    for arm, by_seed in runs.items():
        run = by_seed["1"]
        rates = run["trace"][f"constraint/{CONSTRAINT}/rate"]
        assert len(rates) == 4 and all(0.0 <= r <= 1.0 for r in rates), arm
        assert [sw["step"] for sw in run["sweeps"]] == [0, 2, 4]
    lam = runs["floor 0"]["1"]["trace"][f"constraint/{CONSTRAINT}/multiplier"]
    assert lam == [0.0] * 4  # the floor arms only measure the rate
    stats = doc["stats"]["constraint"]
    assert stats["budget"] == mr.BUDGET and set(stats["arms"]) == set(runs)
    check = _run("benchmarks.studies.model_rewards_stats", f"--json={out}")
    assert check.returncode == 0 and "agrees" in check.stdout, check.stdout + check.stderr


def test_stored_study_recomputes() -> None:
    proc = _run("benchmarks.studies.model_rewards_stats")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = read(mr.DOC)
    assert set(doc["stats"]) == {"rm", "constraint"}  # both parts are stored, with statistics
