"""Reward-hacking monitor on synthetic reward / eval / answer streams."""

from __future__ import annotations

import logging
import math
import random

import pytest

from megatron_rl.rewards.config import RewardsConfig
from megatron_rl.rewards.monitor import RewardHackingMonitor

WINDOW = 5


def feed(monitor, domain, means, evals=None, seed=0):
    """Feed one step per mean reward (8 samples around it, distinct answers per task);
    ``evals`` maps step -> eval accuracy. Returns the metrics of every step."""
    rng = random.Random(seed)
    out = []
    for step, mean in enumerate(means):
        if evals and step in evals:
            monitor.observe_eval(step, domain, evals[step])
        rewards = [min(1.0, max(0.0, mean + rng.uniform(-0.05, 0.05))) for _ in range(8)]
        answers = [f"answer for task {step}-{i} with enough text" for i in range(8)]
        out.append(
            monitor.observe(step, domain, rewards, answers, [f"{step}-{i}" for i in range(8)])
        )
    return out


def test_steady_rewards_raise_nothing():
    monitor = RewardHackingMonitor(window=WINDOW)
    metrics = feed(monitor, "code", [0.4] * 30)
    assert all(m["monitor/code/reward_jump_warning"] == 0.0 for m in metrics)
    assert abs(metrics[-1]["monitor/code/reward_jump"]) < 0.05
    assert list(monitor.samples) == []


def test_jump_without_eval_rise_warns_once_with_a_sample(caplog):
    monitor = RewardHackingMonitor(window=WINDOW)
    evals = {0: 0.3, 10: 0.3, 15: 0.31, 19: 0.3}
    with caplog.at_level(logging.WARNING, logger="megatron_rl.rewards.monitor"):
        metrics = feed(monitor, "code", [0.2] * 10 + [0.9] * 10, evals)
    warned = [i for i, m in enumerate(metrics) if m["monitor/code/reward_jump_warning"] == 1.0]
    assert warned and warned[0] >= 10
    jump_at_first = metrics[warned[0]]["monitor/code/reward_jump"]
    assert jump_at_first >= 0.25
    assert len(monitor.samples) == 1  # logged when the warning turns on, not every step
    sample = monitor.samples[0]
    assert (sample["domain"], sample["kind"], sample["step"]) == ("code", "reward_jump", warned[0])
    assert len(sample["examples"]) == 5 and "possible reward hacking in code" in caplog.text


def test_jump_matched_by_eval_rise_is_not_flagged():
    monitor = RewardHackingMonitor(window=WINDOW)
    evals = {s: 0.2 if s < 10 else 0.85 for s in range(0, 20, 2)}
    metrics = feed(monitor, "math", [0.2] * 10 + [0.9] * 10, evals)
    assert all(m["monitor/math/reward_jump_warning"] == 0.0 for m in metrics)
    assert metrics[12]["monitor/math/eval_delta"] == pytest.approx(0.65)


def test_jump_without_any_eval_is_flagged():
    monitor = RewardHackingMonitor(window=WINDOW)
    metrics = feed(monitor, "code", [0.1] * 10 + [0.8] * 10)
    assert [m["monitor/code/reward_jump_warning"] for m in metrics[10:15]] == [0.0] + [1.0] * 4
    assert math.isnan(metrics[12]["monitor/code/eval_delta"])
    # once both windows hold the new level, the rise is no longer a jump
    assert metrics[-1]["monitor/code/reward_jump_warning"] == 0.0


def test_domains_are_tracked_separately():
    monitor = RewardHackingMonitor(window=WINDOW)
    feed(monitor, "code", [0.1] * 10 + [0.8] * 10)
    metrics = feed(monitor, "math", [0.5] * 20)
    assert metrics[-1]["monitor/math/reward_jump_warning"] == 0.0


def feed_scored(monitor, domain, rewards, verified):
    """One step per (model reward mean, verifier reward mean), 8 samples each."""
    out = []
    for step, (r, v) in enumerate(zip(rewards, verified, strict=True)):
        answers = [f"answer {step}-{i} long enough to keep" for i in range(8)]
        ids = [f"{step}-{i}" for i in range(8)]
        out.append(monitor.observe(step, domain, [r] * 8, answers, ids, [v] * 8))
    return out


def test_model_reward_rising_while_the_verifier_falls_is_flagged_without_an_eval():
    monitor = RewardHackingMonitor(window=WINDOW, divergence_threshold=0.05)
    rm = [0.5] * 10 + [0.6] * 10
    metrics = feed_scored(monitor, "spell", rm, [0.4] * 10 + [0.3] * 10)
    warned = [i for i, m in enumerate(metrics) if m["monitor/spell/divergence_warning"] == 1.0]
    assert warned[0] == 12  # the recent window holds 3 of 5 steps of the change: 0.06 >= 0.05
    assert metrics[13]["monitor/spell/verified_change"] == pytest.approx(-0.08)
    kinds = [s["kind"] for s in monitor.samples]
    assert kinds.count("reward_divergence") == 1  # logged when it turns on
    # no jump warning: a 0.1 rise is under the jump threshold, so only the divergence check
    # caught it
    assert all(m["monitor/spell/reward_jump_warning"] == 0.0 for m in metrics)


def test_reward_flat_while_the_verifier_collapses_is_flagged_and_a_shared_fall_is_not():
    """The collapse seen against the study's reward models: the reward stays, the verifier's
    falls. A reward that falls with the verifier (an honest scorer in a bad patch) is not it."""
    monitor = RewardHackingMonitor(window=WINDOW, divergence_threshold=0.05)
    flat = feed_scored(monitor, "spell", [0.7] * 20, [0.6] * 10 + [0.0] * 10)
    assert [m["monitor/spell/divergence_warning"] for m in flat].index(1.0) == 10
    shared = RewardHackingMonitor(window=WINDOW, divergence_threshold=0.05)
    both = feed_scored(shared, "spell", [0.7] * 10 + [0.55] * 10, [0.6] * 10 + [0.4] * 10)
    assert all(m["monitor/spell/divergence_warning"] == 0.0 for m in both)


def test_both_rising_or_verifier_steady_is_not_divergence():
    for verified in ([0.4] * 10 + [0.5] * 10, [0.4] * 20, [0.4] * 10 + [0.37] * 10):
        monitor = RewardHackingMonitor(window=WINDOW, divergence_threshold=0.05)
        metrics = feed_scored(monitor, "spell", [0.5] * 10 + [0.6] * 10, verified)
        assert all(m["monitor/spell/divergence_warning"] == 0.0 for m in metrics), verified
    # without the verifier's rewards there is no divergence key at all
    plain = RewardHackingMonitor(window=WINDOW)
    assert "monitor/code/divergence_warning" not in feed(plain, "code", [0.4] * 12)[-1]
    with pytest.raises(ValueError, match="verified has 1 values for 2"):
        plain.observe(0, "code", [1.0, 0.0], ["a", "b"], ["t", "u"], [1.0])
    with pytest.raises(ValueError, match="divergence_threshold"):
        RewardHackingMonitor(divergence_threshold=0.0)


def test_identical_answer_across_tasks_is_flagged():
    monitor = RewardHackingMonitor(window=WINDOW)
    hack = "import sys; sys.exit(0)  # always passes"
    answers = [hack] * 5 + [f"a real, different solution number {i}" for i in range(3)]
    tasks = [f"t{i}" for i in range(8)]
    metrics = monitor.observe(3, "code", [1.0] * 5 + [0.0] * 3, answers, tasks)
    assert metrics["monitor/code/answer_cluster_warning"] == 1.0
    assert metrics["monitor/code/answer_cluster_frac"] == pytest.approx(5 / 8)
    sample = monitor.samples[-1]
    assert sample["kind"] == "answer_cluster"
    assert [e["answer"] for e in sample["examples"]] == [hack] * 5


def test_identical_answers_within_one_task_or_short_are_normal():
    monitor = RewardHackingMonitor(window=WINDOW)
    same_task = monitor.observe(0, "code", [1.0] * 8, ["def f(): return the same thing"] * 8,
                                ["t0"] * 4 + ["t1"] * 4)  # fmt: skip
    assert same_task["monitor/code/answer_cluster_warning"] == 0.0
    short = monitor.observe(1, "math", [1.0] * 8, ["42"] * 8, [f"t{i}" for i in range(8)])
    assert short["monitor/math/answer_cluster_warning"] == 0.0
    assert list(monitor.samples) == []


def test_bad_input_and_config():
    monitor = RewardHackingMonitor.from_config(RewardsConfig())
    with pytest.raises(ValueError, match="equal lengths"):
        monitor.observe(0, "code", [1.0], ["a", "b"], ["t"])
    with pytest.raises(ValueError, match="window"):
        RewardHackingMonitor(window=0)


def test_loop_writes_each_warning_as_one_event_also_past_the_kept_samples(tmp_path, monkeypatch):
    """rl_report.monitor_step: every new warning is one ``reward_hacking_warning`` event at its
    step (the sample's own ``step`` key once crashed ``Tracker.event``), also once the monitor's
    bounded sample list is full."""
    import json
    from types import SimpleNamespace

    from megatron_rl.controller.monitoring import monitor_step
    from megatron_rl.rewards import monitor as monitor_mod
    from megatron_rl.tracking.config import TrackingConfig
    from megatron_rl.tracking.tracker import Tracker

    monkeypatch.setattr(monitor_mod, "MAX_SAMPLES", 2)
    monitor = RewardHackingMonitor(window=WINDOW)
    rt = SimpleNamespace(tracker=Tracker(TrackingConfig(wandb="disabled"), tmp_path, {}))
    hack = "import sys; sys.exit(0)  # always passes"

    def group(step: int, i: int) -> SimpleNamespace:  # the cluster is on at even steps only
        hacked = i < 5 and step % 2 == 0
        text = hack if hacked else f"a real, different solution number {step}-{i}"
        return SimpleNamespace(
            spec=SimpleNamespace(domain="code"),
            task=SimpleNamespace(id=f"{step}-{i}"),
            samples=[SimpleNamespace(reward=1.0 if i < 5 else 0.0, text=text, verifier_reward=0.0)],
        )

    for step in range(7):
        monitor_step(rt, monitor, step, [group(step, i) for i in range(8)])  # type: ignore[arg-type]
    events = [json.loads(x) for x in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [(e["step"], e["event"], e["domain"], e["warning"]) for e in events] == [
        (s, "reward_hacking_warning", "code", "answer_cluster") for s in (0, 2, 4, 6)
    ]
    assert len(monitor.samples) == 2 and monitor.n_warnings == 4
    # the flagged answers, one row each, for a person to read (and a W&B table when online)
    rows = [json.loads(x) for x in (tmp_path / "reward_hacking.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [s for s in (0, 2, 4, 6) for _ in range(5)]
    assert {(r["warning"], r["answer"], r["domain"]) for r in rows} == {
        ("answer_cluster", hack, "code")
    }
