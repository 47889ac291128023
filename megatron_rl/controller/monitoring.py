"""Per-step watching of what the policy produces: the reward-hacking monitor and sample tables."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from megatron_rl.rewards.monitor import RewardHackingMonitor
from megatron_rl.run import Run


def monitor_step(
    rt: Run,
    monitor: RewardHackingMonitor,
    step: int,
    groups: list[Any],
    model_scored: Callable[[str], bool] = lambda domain: False,
) -> dict[str, float]:
    """Feed one step's samples to the reward-hacking monitor; new warnings become events.
    ``model_scored(domain)``: a judge or reward model scores it, so the verifier's reward of each
    sample goes beside its reward (the divergence check)."""
    by_domain: dict[str, list[tuple[float, str, str, float]]] = {}
    for g in groups:
        for s in g.samples:
            row = (s.reward, s.text, g.task.id, s.verifier_reward)
            by_domain.setdefault(g.spec.domain, []).append(row)
    seen = monitor.n_warnings
    metrics: dict[str, float] = {}
    for domain, rows in sorted(by_domain.items()):
        rewards, answers, ids, verified = zip(*rows, strict=True)
        checked = verified if model_scored(domain) else None
        metrics.update(monitor.observe(step, domain, rewards, answers, ids, checked))
    new = min(monitor.n_warnings - seen, len(monitor.samples))
    flagged: list[list[Any]] = []
    for sample in list(monitor.samples)[len(monitor.samples) - new :]:
        # the event has its own step and kind: the sample's kind is the warning's
        fields = {k: v for k, v in sample.items() if k not in ("step", "kind")}
        rt.tracker.event(step, "reward_hacking_warning", warning=sample.get("kind"), **fields)
        for ex in sample.get("examples", []):
            head = [sample["domain"], sample.get("kind"), sample.get("detail")]
            flagged.append(head + [ex["task_id"], ex["reward"], ex["answer"]])
    if flagged:  # the flagged answers for a person to read: reward_hacking.jsonl, a W&B table
        cols = ["domain", "warning", "detail", "task_id", "reward", "answer"]
        rt.tracker.table(step, "reward_hacking", cols, flagged)
    return metrics


def log_samples(rt: Run, step: int, groups: list[Any]) -> None:
    """A few trajectories per log as a W&B table (and samples.jsonl)."""
    k = rt.cfg.tracking.samples_per_log
    if k <= 0 or step % max(1, rt.cfg.tracking.log_every) != 0:
        return
    rows = [
        [g.spec.domain, g.task.prompt[:500], s.text[:500], g.task.gold[:200], s.reward]
        + [s.verifier_reward]
        for g in groups[:k]
        for s in g.samples[:1]
    ]
    cols = ["domain", "prompt", "response", "gold", "reward", "verifier_reward"]
    rt.tracker.table(step, "samples", cols, rows)
