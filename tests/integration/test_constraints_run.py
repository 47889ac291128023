"""A run with a priced constraint (rewards.constraints): the multiplier and the violation rate
are logged at every step, and a resumed run carries the multiplier on from its checkpoint."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHORT = [
    "eval.every=0",
    "eval.samples_per_domain=2",
    "eval.train_prompts=0",
    "tracking.wandb=disabled",
    "tracking.progress=false",
]


def _rows(config: str, run: Path, key: str, overrides: list[str]) -> list[dict]:
    """Train ``config`` with ``overrides`` into ``run``; its metrics rows holding ``key``."""
    args = [config, f"output_dir={run.parent}", f"run_name={run.name}", *SHORT, *overrides]
    proc = subprocess.run(
        [sys.executable, "-m", "launch.cli", "train", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if key in r]


def _train(tmp_path: Path, steps: int) -> list[dict]:
    overrides = [
        f"train.steps={steps}",
        'domains.include=["safety/refuse", "safety/lookalike"]',
        "rl.prompts_per_step=4",
        "rl.group_size=4",
        'rewards.constraints={"hard_violation": 0.05}',
        "rewards.violation_floor=false",
        "rewards.constraint_lr=0.5",
        "checkpoint.every=1",
    ]
    return _rows("configs/demo_cpu.yaml", tmp_path / "c", "rollout/groups_generated", overrides)


def test_multiplier_is_logged_every_step_and_resumes(tmp_path) -> None:
    first = _train(tmp_path, 2)
    assert len(first) == 2
    for r in first:
        assert r["constraint/hard_violation/budget"] == 0.05
        rate = r["constraint/hard_violation/rate"]  # refuse samples only: lookalike cannot violate
        assert 0.0 <= rate <= 1.0 and r["constraint/hard_violation/multiplier"] >= 0.0
    lam = [r["constraint/hard_violation/multiplier"] for r in first]
    assert lam[1] == max(0.0, lam[0] + 0.5 * (first[1]["constraint/hard_violation/rate"] - 0.05))
    resumed = _train(tmp_path, 3)  # the same run directory: resumes at step 2
    last = resumed[-1]
    assert last["step"] == 2
    want = max(0.0, lam[1] + 0.5 * (last["constraint/hard_violation/rate"] - 0.05))
    assert abs(last["constraint/hard_violation/multiplier"] - min(10.0, want)) < 1e-12


def test_a_judge_reward_config_trains_and_counts_its_verdicts(tmp_path) -> None:
    """configs/judge_cpu.yaml for 2 steps: the judge scored or counted every judged sample."""
    overrides = ["train.steps=2", "rl.prompts_per_step=4"]
    rows = _rows("configs/judge_cpu.yaml", tmp_path / "j", "judge/scored", overrides)
    assert len(rows) == 2
    last = rows[-1]
    judged = last["judge/scored"] + sum(
        last[f"judge/failures/{k}"] for k in ("empty", "unparsable", "timeout", "dead")
    )
    assert judged > 0 and last["judge/failures/dead"] == 0 and last["judge/failures/timeout"] == 0


def test_a_reward_model_config_trains_and_counts_its_scores(tmp_path) -> None:
    """configs/reward_model_cpu.yaml (models/tiny-rm, replacing the verifier's terms) for 2
    steps: every sample of the spelling domains scored by the reward model or counted."""
    overrides = ["train.steps=2", "rl.prompts_per_step=4"]
    rows = _rows("configs/reward_model_cpu.yaml", tmp_path / "r", "reward_model/scored", overrides)
    assert len(rows) == 2
    last = rows[-1]
    assert last["reward_model/scored"] == 2 * 4 * 8  # 2 steps x 4 groups x 8 samples
    assert all(last[f"reward_model/failures/{k}"] == 0 for k in ("timeout", "dead", "invalid"))
    rewards = [r["rollout/reward_mean"] for r in rows]
    assert all(0.0 < x < 1.0 for x in rewards)  # sigmoid scores, not the verifier's 0/1
