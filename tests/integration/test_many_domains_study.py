"""benchmarks/studies/many_domains.py (issue 40): the quick mode trains two arms for real and
checks their generation budget from the runs' own metrics; the stored study recomputes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.studies import many_domains as md
from benchmarks.studies.many_stats import read

ROOT = Path(__file__).resolve().parents[2]


def test_seeds_are_fixed_apart() -> None:
    assert len(md.REPORT_SEEDS) >= 8 and len(md.DEV_SEEDS) >= 2
    assert not set(md.REPORT_SEEDS) & set(md.DEV_SEEDS)


def test_quick_mode_trains_two_arms_at_equal_generation(tmp_path) -> None:
    out, runs = tmp_path / "q.json.gz", tmp_path / "runs"
    args = ["--quick", "--json", str(out), "--run-dir", str(runs), "--jobs", "1"]
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.studies.many_domains", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=1200,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = read(out)
    sec = doc["sections"]["dev"]
    assert set(sec["runs"]) == {"uniform + filter", "uniform"}
    for arm, by_seed in sec["runs"].items():
        ex = by_seed["1"]
        assert ex["generated"] == [md.PER_STEP] * 4
        if arm == "uniform":
            assert ex["trained"] == ex["generated"]
        else:
            assert ex["trained"] == ex["signal"]
        assert [s["step"] for s in ex["sweeps"]] == [0, 2, 4]
        assert len(ex["sweeps"][-1]["acc"]) == len(md.QUICK_DOMAINS)
    assert "primary" in proc.stdout and "seconds per run" in proc.stdout
    assert (runs / "uniform_filter-s1" / "eval_heatmap.png").is_file()
    check = subprocess.run(
        [sys.executable, "-m", "benchmarks.studies.many_stats", "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert check.returncode == 0 and "agrees" in check.stdout, check.stdout + check.stderr


def test_stored_study_recomputes() -> None:
    if not md.DOC.is_file():
        pytest.skip("no stored many-domain runs yet")
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.studies.many_stats"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.dumps(read(md.DOC)["stats"])  # the statistics are stored beside the runs
