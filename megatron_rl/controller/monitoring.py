"""Per-step watching of what the policy produces: the reward-hacking monitor and sample tables."""

from __future__ import annotations

from typing import Any

from megatron_rl.rewards.monitor import RewardHackingMonitor
from megatron_rl.train.runtime import Runtime


def monitor_step(
    rt: Runtime, monitor: RewardHackingMonitor, step: int, groups: list[Any]
) -> dict[str, float]:
    """Feed one step's samples to the reward-hacking monitor; new warnings become events."""
    by_domain: dict[str, list[tuple[float, str, str]]] = {}
    for g in groups:
        for s in g.samples:
            by_domain.setdefault(g.spec.domain, []).append((s.reward, s.text, g.task.id))
    seen = monitor.n_warnings
    metrics: dict[str, float] = {}
    for domain, rows in sorted(by_domain.items()):
        rewards, answers, ids = zip(*rows, strict=True)
        metrics.update(monitor.observe(step, domain, rewards, answers, ids))
    new = min(monitor.n_warnings - seen, len(monitor.samples))
    for sample in list(monitor.samples)[len(monitor.samples) - new :]:
        # the event has its own step and kind: the sample's kind is the warning's
        fields = {k: v for k, v in sample.items() if k not in ("step", "kind")}
        rt.tracker.event(step, "reward_hacking_warning", warning=sample.get("kind"), **fields)
    return metrics


def log_samples(rt: Runtime, step: int, groups: list[Any]) -> None:
    """A few trajectories per log as a W&B table (and samples.jsonl)."""
    k = rt.cfg.tracking.samples_per_log
    if k <= 0 or step % max(1, rt.cfg.tracking.log_every) != 0:
        return
    rows = [
        [g.spec.domain, g.task.prompt[:500], s.text[:500], g.task.gold[:200], s.reward]
        for g in groups[:k]
        for s in g.samples[:1]
    ]
    rt.tracker.table(step, "samples", ["domain", "prompt", "response", "gold", "reward"], rows)
