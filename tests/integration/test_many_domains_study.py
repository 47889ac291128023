"""benchmarks/studies/many_domains.py (issue 40): the quick mode trains two arms for real and
checks their generation budget from the runs' own metrics; the stored study recomputes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.studies import many_domains as md
from benchmarks.studies.stored_runs import read

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
    assert set(sec["runs"]) == {"uniform + filter", "uniform", md.PRESCREEN}
    screened = sec["runs"][md.PRESCREEN]["1"]["prescreen"]
    assert screened["groups"] == md.PRESCREEN_GROUPS * len(md.QUICK_DOMAINS)
    assert set(screened["domains"]) <= set(md.QUICK_DOMAINS) and screened["steps_charged"] == 1
    for arm, by_seed in sec["runs"].items():
        ex = by_seed["1"]
        steps = 4 - (1 if arm == md.PRESCREEN else 0)  # the pre-screen's generation is charged
        assert ex["generated"] == [md.PER_STEP] * steps
        if arm == "uniform":
            assert ex["trained"] == ex["generated"]
        else:
            assert ex["trained"] == ex["signal"]
        assert [s["step"] for s in ex["sweeps"]] == [0, 2, steps]
        assert len(ex["sweeps"][-1]["acc"]) == len(md.QUICK_DOMAINS)
    assert "primary" in proc.stdout and "seconds per run" in proc.stdout
    assert (runs / "uniform_filter-s1" / "eval_heatmap.png").is_file()
    assert not (runs / "uniform_filter-s1" / "eval_failures.jsonl").exists()  # off in the config
    check = subprocess.run(
        [sys.executable, "-m", "benchmarks.studies.many_stats", "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert check.returncode == 0 and "agrees" in check.stdout, check.stdout + check.stderr


def test_an_unknown_arm_is_refused_before_anything_runs(tmp_path) -> None:
    out = tmp_path / "q.json.gz"
    with pytest.raises(SystemExit, match=r"--arms \['nope'\]: part dev has .*uniform \+ filter"):
        md.main(["--quick", "--arms", "uniform", "nope", "--json", str(out)])
    assert not out.exists()


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


def test_dynamic_sampling_fills_the_batch_and_the_rollout_budget_ends_the_run(tmp_path) -> None:
    """DAPO's dynamic sampling: rounds of 4 groups until 3 with reward variance (at most 3
    rounds), the first 3 trained; the rollout budget (20 groups) ends the run early with its
    final sweep, as its arm in the study needs (equal generated groups)."""
    domains = ["ladder/letter_counting_words2", "ladder/spell_backward_len4", "rg/gcd@0"]
    overrides = [
        f"output_dir={tmp_path}",
        "run_name=dyn",
        "train.steps=12",
        "rl.prompts_per_step=4",
        "rl.group_size=4",
        f"domains.include={json.dumps(domains)}",
        "eval.every=0",
        "eval.samples_per_domain=4",
        "scheduler.dynamic_sampling=true",
        "scheduler.dynamic_target=3",
        "scheduler.dynamic_max_rounds=3",
        "train.rollout_budget_groups=20",
        "tracking.wandb=disabled",
        "tracking.progress=false",
        "checkpoint.every=0",
    ]
    cmd = [sys.executable, "-m", "launch.cli", "train", str(md.CONFIG), *overrides]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [json.loads(x) for x in (tmp_path / "dyn" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "rollout/groups_generated" in r]
    assert 1 <= len(steps) < 12  # the budget ended it
    totals = [r["rollout/groups_generated_total"] for r in steps]
    assert totals[-1] >= 20 > totals[-2] if len(totals) > 1 else totals[-1] >= 20
    for r in steps:
        gen, rounds = r["rollout/groups_generated"], r["rollout/rounds"]
        assert gen == 4 * rounds and 1 <= rounds <= 3
        trained, signal = r["rollout/groups_trained"], r["rollout/groups_trained_with_signal"]
        assert trained == signal <= 3
        if rounds < 3:  # it stopped generating because the batch was full
            assert trained == 3
    events = (tmp_path / "dyn" / "events.jsonl").read_text()
    assert "rollout_budget_spent" in events
    summary = json.loads((tmp_path / "dyn" / "summary.json").read_text())
    assert summary["steps"] == len(steps)
    bad = subprocess.run(
        [*cmd[:-1], "checkpoint.every=0", "rl.off_policy=true"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert bad.returncode != 0 and "rl.off_policy=false with dynamic sampling" in bad.stderr
