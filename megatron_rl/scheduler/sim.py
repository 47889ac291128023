"""A simulator of multi-domain RL training, to compare scheduler policies in seconds on a CPU.

The model (all hidden from the scheduler, which only sees :class:`GroupResult` lists and eval
scores, exactly what the RL loop gives it):

* **Skill.** Domain ``i`` has a latent skill ``s_i`` (logits). A task at level ``l`` with task
  offset ``o`` is solved with probability ``sigmoid((s_i - d_i - l * level_step + o) / T)``
  at temperature ``T``. Difficulties ``d_i`` are spread so that at the start some domains are
  near 0% and some near 100%. All completions of a group share the task (one ``o``), which is
  what makes real groups all-pass or all-fail.
* **Learning.** A group trains its domain in proportion to its reward standard deviation
  (GRPO: equal rewards give zero advantage, so zero-variance groups teach nothing). The batch
  loss is a mean over the trained groups, so zero-variance groups in the batch dilute the
  update. Within one step, gains of one domain saturate (``u / (1 + u / saturation)``):
  groups of the same domain give correlated gradients.
* **Interference.** Domains sit in ``n_clusters`` clusters (the radar's domain groups). Training
  a domain transfers ``transfer`` of its gain, shared among its cluster, to the cluster's other
  domains, and adds ``M[c, c'] *`` its gain, shared among the cluster, to every domain in each
  other cluster ``c``. ``M`` is random per seed: mostly small entries around ``cross_mean``
  (capacity competition is slightly negative), plus a fraction ``conflict_frac`` of cluster
  pairs with a strong negative entry (e.g. terse vs verbose answer styles). Negative
  interference erodes what a domain has learned, so it is scaled by ``min(1, 2 * p0)`` where
  ``p0`` is the domain's level-0 pass rate: a domain near 0% has little left to lose (without
  this, conflicting clusters drove domains linearly to 0.000 accuracy, which no policy can undo
  because all-fail groups carry no signal). Numbers are
  illustrative, not fitted to a real model: the benchmark prints results for the default and
  for interference/noise switched off so the reader can see what drives the difference.
* **Noise.** Skills take a small Gaussian random walk each step (``drift``, optimizer noise and
  unmodelled effects); eval sweeps score a fixed, level-stratified eval set per domain by
  sampling ``eval_samples`` completions per task, so eval scores are binomially noisy.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from megatron_rl.scheduler.config import SchedulerConfig
from megatron_rl.scheduler.scheduler import DomainScheduler
from megatron_rl.scheduler.types import DomainInfo, GroupResult, GroupSpec


@dataclass
class SimConfig:
    """Simulated domains and training dynamics."""

    n_domains: int = 200  # number of domains
    n_clusters: int = 10  # domain groups with shared transfer and interference
    n_levels: int = 3  # difficulty levels per domain
    level_step: float = 1.5  # difficulty added per level (logits)
    difficulty_mean: float = 0.5  # mean of s_i - d_i at level 0 at the start (logits)
    difficulty_std: float = 1.5  # spread of s_i - d_i across domains (logits)
    task_std: float = 1.0  # spread of per-task offsets (logits)
    group_size: int = 8  # completions per group
    lr: float = 8.0  # logit gain per step of a fully informative batch, shared over the batch
    saturation: float = 4.0  # per-domain per-step gain saturates above this many groups
    transfer: float = 0.3  # share of a domain's gain passed to its own cluster
    cross_mean: float = -0.02  # mean cluster -> cluster interference per unit gain
    cross_std: float = 0.05  # spread of cluster -> cluster interference
    conflict_frac: float = 0.1  # fraction of cluster pairs with strong negative interference
    conflict: float = -0.5  # interference of a conflicting cluster pair per unit gain
    drift: float = 0.01  # std of the per-step random walk of every skill (logits)
    eval_tasks: int = 60  # fixed eval tasks per domain (split evenly over levels)
    eval_samples: int = 4  # completions per eval task


class DomainSim:
    """Hidden skills and dynamics; talks to a scheduler only through results and eval scores."""

    def __init__(self, cfg: SimConfig, seed: int):
        self.cfg = cfg
        self.rng = np.random.default_rng(seed)
        n, k = cfg.n_domains, cfg.n_clusters
        self.cluster = np.arange(n) % k
        self.rng.shuffle(self.cluster)
        self.skill = self.rng.normal(cfg.difficulty_mean, cfg.difficulty_std, n)
        m = self.rng.normal(cfg.cross_mean, cfg.cross_std, (k, k))
        m[self.rng.random((k, k)) < cfg.conflict_frac] = cfg.conflict
        np.fill_diagonal(m, cfg.transfer)
        self.interference = m  # [k, k]: effect on cluster row of training cluster column
        self.cluster_size = np.bincount(self.cluster, minlength=k).astype(float)
        levels = np.arange(cfg.eval_tasks) % cfg.n_levels
        self.eval_level = np.broadcast_to(levels, (n, cfg.eval_tasks))
        self.eval_offset = self.rng.normal(0.0, cfg.task_std, (n, cfg.eval_tasks))
        self.names = [f"c{c}/d{i:04d}" for i, c in enumerate(self.cluster)]
        self.pos = {name: i for i, name in enumerate(self.names)}

    def domains(self) -> list[DomainInfo]:
        levels = list(range(self.cfg.n_levels))
        return [DomainInfo(name, "core", levels, [name.split("/")[0]]) for name in self.names]

    def _logit(self, i: np.ndarray, level: np.ndarray, offset: np.ndarray) -> np.ndarray:
        return self.skill[i] - level * self.cfg.level_step + offset

    def rollout(self, specs: list[GroupSpec]) -> list[GroupResult]:
        """Sample rewards for each planned group (shapes: G groups x group_size)."""
        g = self.cfg.group_size
        i = np.array([self.pos[s.domain] for s in specs])
        level = np.array([s.level for s in specs], dtype=float)
        temp = np.array([s.temperature for s in specs])
        offset = self.rng.normal(0.0, self.cfg.task_std, len(specs))
        p = 1.0 / (1.0 + np.exp(-self._logit(i, level, offset) / temp))
        rewards = (self.rng.random((len(specs), g)) < p[:, None]).astype(float)
        lens = self.rng.integers(50, 400, (len(specs), g))
        entropy = temp * (0.2 + 0.8 * (1.0 - p))  # a plausible proxy: falls as the domain is solved
        return [
            GroupResult(
                s.domain,
                s.level,
                rewards[k].tolist(),
                lens[k].tolist(),
                [bool(x) for x in lens[k] >= 399],
                float(entropy[k]),
                heated=s.heated,
            )
            for k, s in enumerate(specs)
        ]

    def train(self, results: list[GroupResult]) -> None:
        """Apply one optimizer step from the trained groups (see the module docstring)."""
        cfg = self.cfg
        n = cfg.n_domains
        u = np.zeros(n)
        for r in results:
            u[self.pos[r.domain]] += 2.0 * float(np.std(r.rewards))
        u = u / (1.0 + u / cfg.saturation)
        gain = cfg.lr * u / max(len(results), 1)
        per_cluster = np.bincount(self.cluster, weights=gain, minlength=cfg.n_clusters)
        mean_gain = per_cluster / self.cluster_size  # [k]
        helps = (np.maximum(self.interference, 0.0) @ mean_gain)[self.cluster]  # [n]
        hurts = (np.minimum(self.interference, 0.0) @ mean_gain)[self.cluster]  # [n], <= 0
        # Interference erodes what was learned: full strength from a 50% level-0 pass rate up.
        erodable = np.minimum(1.0, 2.0 / (1.0 + np.exp(-self.skill)))
        own = gain * (1.0 - cfg.transfer / self.cluster_size[self.cluster])
        delta = own + helps + hurts * erodable
        self.skill += delta + self.rng.normal(0.0, cfg.drift, n)

    def expected_eval(self) -> np.ndarray:
        """Noise-free eval accuracy per domain [n_domains] (the benchmark's ground truth)."""
        i = np.arange(self.cfg.n_domains)[:, None]
        p = 1.0 / (1.0 + np.exp(-self._logit(i, self.eval_level, self.eval_offset)))
        return p.mean(axis=1)

    def eval_scores(self) -> dict[str, list[float]]:
        """Noisy per-task eval scores: mean of eval_samples completions per fixed task."""
        i = np.arange(self.cfg.n_domains)[:, None]
        p = 1.0 / (1.0 + np.exp(-self._logit(i, self.eval_level, self.eval_offset)))
        k = self.cfg.eval_samples
        score = self.rng.binomial(k, p) / k
        return {name: score[j].tolist() for j, name in enumerate(self.names)}


@dataclass
class SimOutcome:
    """Ground-truth outcome of one simulated run (from the simulator, not the scheduler)."""

    final: np.ndarray  # expected eval accuracy per domain at the end [n_domains]
    best: np.ndarray  # best expected eval accuracy per domain over sweeps [n_domains]
    start: np.ndarray  # expected eval accuracy at the start [n_domains]
    rollouts: int  # groups generated
    events: list = field(default_factory=list)  # scheduler events

    @property
    def regressions(self) -> int:
        """Domains that ended more than 2 points below their best."""
        return int((self.final < self.best - 0.02).sum())


def simulate(
    sched_cfg: SchedulerConfig,
    sim_cfg: SimConfig,
    seed: int,
    steps: int = 300,
    num_groups: int = 64,
    eval_every: int = 20,
) -> SimOutcome:
    """Drive a scheduler against a fresh simulator: plan, rollout, observe, select, train."""
    sim = DomainSim(sim_cfg, seed)
    sched = DomainScheduler(sched_cfg, sim.domains(), seed=seed + 10_000)
    start = sim.expected_eval()
    best = start.copy()
    sched.observe_eval(0, sim.eval_scores())
    rollouts = 0
    for step in range(1, steps + 1):
        specs = sched.plan(step, num_groups)
        results = sim.rollout(specs)
        rollouts += len(results)
        sched.observe(step, results)
        kept = sched.select(results, num_groups)
        sim.train([results[k] for k in kept])
        if step % eval_every == 0 or step == steps:
            best = np.maximum(best, sim.expected_eval())
            sched.observe_eval(step, sim.eval_scores())
    return SimOutcome(sim.expected_eval(), best, start, rollouts, sched.events)
