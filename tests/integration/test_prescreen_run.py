"""``scheduler.prescreen_groups`` in a real run (megatron_rl/controller/prescreen.py): the run
screens its domains before step 0 exactly as the many-domain study's pre-screen arm did, the
screened-out domains get no share of the mix, the screen is charged to the generation count, and
a resumed run does not screen again."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.studies import many_domains as md

ROOT = Path(__file__).resolve().parents[2]


def train(out: Path, steps: int) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "launch.cli", "train", str(md.CONFIG), f"output_dir={out}"]
    cmd += [
        "run_name=p",
        f"train.steps={steps}",
        "eval.every=2",
        "eval.samples_per_domain=2",
        "eval.samples_per_prompt=1",
        "checkpoint.every=1",
        "tracking.wandb=disabled",
        "tracking.progress=false",
        f"domains.include={json.dumps(md.QUICK_DOMAINS)}",
        "scheduler.prescreen_groups=2",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_a_run_screens_once_like_the_study_arm_and_plans_only_what_it_kept(tmp_path) -> None:
    train(tmp_path, steps=2)
    run = tmp_path / "p"
    screen = json.loads((run / "prescreen.json").read_text())
    assert screen["groups"] == 2 * len(md.QUICK_DOMAINS)
    assert sorted(screen["kept"] + screen["dropped"]) == sorted(md.QUICK_DOMAINS)
    assert screen["dropped"], "the quick set has out-of-reach domains: some must be dropped"
    # the same screen as the study's pre-screen arm of seed 1 (config seed), run apart
    args = argparse.Namespace(steps=4, eval_every=2, wandb="disabled", quick=True, run_dir=None)
    _, arm = md.prescreen(1, args)
    assert arm["domains"] == screen["kept"] and arm["groups"] == screen["groups"]
    events = [e for e in rows(run / "events.jsonl") if e["event"] == "prescreen"]
    assert len(events) == 1 and events[0]["kept"] == len(screen["kept"])
    metrics = [r for r in rows(run / "metrics.jsonl") if "rollout/groups_generated_total" in r]
    first = metrics[0]
    assert first["rollout/groups_generated_total"] == screen["groups"] + md.PER_STEP
    assert "startup/prescreen_s" in first
    for d in screen["dropped"]:
        assert first[f"sched/{d}/weight"] == 0.0, d
    assert all(first[f"sched/{d}/weight"] > 0 for d in screen["kept"])
    # the study's extract of such a run (its screened part): the screen in, the budget checked
    ex = md.extract(run)
    assert ex["prescreen"] == {"groups": screen["groups"], "domains": screen["kept"]}
    md.check_budget("p", ex, ["scheduler.prescreen_groups=2"], steps=2 + 1)
    with pytest.raises(RuntimeError, match="more than the budget"):  # the screen counts
        md.check_budget("p", ex, ["scheduler.prescreen_groups=2"], steps=2)
    # resumed: no second screen, the count goes on from the checkpoint
    train(tmp_path, steps=3)
    events = [e for e in rows(run / "events.jsonl") if e["event"] == "prescreen"]
    assert len(events) == 1
    last = [r for r in rows(run / "metrics.jsonl") if "rollout/groups_generated_total" in r][-1]
    assert last["rollout/groups_generated_total"] == screen["groups"] + 3 * md.PER_STEP
    assert json.loads((run / "prescreen.json").read_text()) == screen
