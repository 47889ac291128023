"""Mix policies: how much of each step's batch each domain gets.

A policy turns per-domain statistics into non-negative scores [n_domains]; the scheduler then
multiplies in the seesaw boost and the lag boost (domains below the median eval), normalises,
mixes in the floor share (``w = floor + (1 - n * floor) * s / sum(s)``) and allocates integer
group counts with systematic sampling (:func:`allocate`): every domain gets ``floor(w * N)`` or
``ceil(w * N)`` groups, so over steps it receives exactly its share in expectation with the
least variance.

Policies (one registry, :data:`POLICIES`):

* ``uniform``: equal scores.
* ``static``: fixed shares from ``weights`` (name or glob -> share, split evenly among the
  domains a pattern matches; the first matching pattern wins) or ``tier_weights`` (share per
  tier, split evenly within the tier).
* ``learning_progress``: a bandit over recent improvement, after the learning-progress
  curricula of Portelas et al. (2019) / Kanitscheider et al. (2021): score = |fast - slow| EMA
  of the level pass rate, less its noise, plus a UCB exploration bonus
  ``lp_explore * sqrt(log(1 + total groups) / (1 + domain groups))``. Deviation: we use
  absolute progress (so regressions also attract samples) and subtract ``confidence_z`` standard
  errors so that small noisy domains do not look like they are moving.
* ``target_difficulty``: favours domains whose level pass rate lies in ``[target_low,
  target_high]``, where GRPO groups most often have reward variance. The score is 1 in the band
  and falls linearly to ``target_min_score`` at pass rate 0 or 1, evaluated at the point of the
  domain's confidence interval closest to the band (optimism for domains with few samples).
* ``learnability``: the expected |advantage| a group of the domain yields, plus a UCB bonus:
  score = EMA of ``mean |reward - group mean|`` over the domain's base-temperature groups
  (``2 p (1 - p)`` per group for 0/1 rewards) ``+ learn_ucb * sqrt(log(1 + N) / (1 + n_i))``,
  with ``N`` all and ``n_i`` the domain's base-temperature groups so far; shares are
  proportional to the score. After DUMP (arXiv 2504.09710: UCB over distributions on the
  expected absolute advantage) and learnability sampling (arXiv 2502.12272: sample by
  ``p (1 - p)``). Deviations: shares proportional to the score (DUMP samples by a softmax of
  it), and the signal is an exponential moving average per group (``ema_decay``) instead of a
  sliding window, like every statistic here.

  Two options, off by default: ``learn_room`` multiplies the signal by the room a domain has
  left, ``1 - p`` (the posterior mean pass rate at its level), so that of two domains giving
  groups with equal signal the one further from saturation gets more (for 0/1 rewards the
  signal becomes ``2 p (1 - p)^2``; a saturated domain's held-out score has little left to
  rise, and rises anyway from its neighbours' training); ``learn_power`` raises
  ``signal + bonus`` to a power before the shares are taken (``> 1`` concentrates the mix on
  the top domains, as DUMP's softmax does at a low temperature; the bonus is added first so it
  stays in the signal's units).
"""

from __future__ import annotations

import fnmatch
from typing import Protocol

import numpy as np

from megatron_rl.scheduler.stats import DomainStats
from megatron_rl.scheduler.types import DomainInfo


class MixSettings(Protocol):
    """The knobs of the mix policies, as :class:`~megatron_rl.scheduler.config.SchedulerConfig`
    holds them. Named here, not imported: the config checks ``policy`` against
    :data:`POLICIES`, so it imports this module."""

    policy: str
    weights: dict[str, float]
    tier_weights: dict[str, float]
    lp_explore: float
    target_low: float
    target_high: float
    target_min_score: float
    confidence_z: float
    learn_ucb: float
    learn_room: bool
    learn_power: float


class MixPolicy:
    """Base class: ``scores(stats)`` returns non-negative scores of shape [n_domains]."""

    def __init__(self, cfg: MixSettings, domains: list[DomainInfo]):
        self.cfg, self.domains = cfg, domains

    def scores(self, stats: DomainStats) -> np.ndarray:
        raise NotImplementedError


class UniformPolicy(MixPolicy):
    def scores(self, stats: DomainStats) -> np.ndarray:
        return np.ones(len(self.domains))


class StaticPolicy(MixPolicy):
    def __init__(self, cfg: MixSettings, domains: list[DomainInfo]):
        super().__init__(cfg, domains)
        self.base = static_shares(cfg, domains)

    def scores(self, stats: DomainStats) -> np.ndarray:
        return self.base


class LearningProgressPolicy(MixPolicy):
    def scores(self, stats: DomainStats) -> np.ndarray:
        progress = stats.progress(self.cfg.confidence_z)
        seen = stats.groups_seen.astype(float)
        bonus = self.cfg.lp_explore * np.sqrt(np.log1p(seen.sum()) / (1.0 + seen))
        # Never-observed domains have no progress estimate: give them the largest score seen.
        unseen = np.isnan(progress)
        top = np.nanmax(progress) if (~unseen).any() else 1.0
        return np.where(unseen, top, progress) + bonus + 1e-6


class TargetDifficultyPolicy(MixPolicy):
    def scores(self, stats: DomainStats) -> np.ndarray:
        cfg = self.cfg
        mean, sd = stats.level_pass_rate()
        lo_ci, hi_ci = mean - cfg.confidence_z * sd, mean + cfg.confidence_z * sd
        # The point of [lo_ci, hi_ci] closest to the band.
        p = np.clip(np.clip(mean, cfg.target_low, cfg.target_high), lo_ci, hi_ci)
        p = np.clip(p, 0.0, 1.0)
        rise = p / max(cfg.target_low, 1e-9)
        fall = (1.0 - p) / max(1.0 - cfg.target_high, 1e-9)
        ramp = np.minimum(np.minimum(rise, fall), 1.0)
        return cfg.target_min_score + (1.0 - cfg.target_min_score) * ramp


class LearnabilityPolicy(MixPolicy):
    def scores(self, stats: DomainStats) -> np.ndarray:
        cfg = self.cfg
        learn = stats.learnability()
        n = stats.measured_seen.astype(float)
        bonus = cfg.learn_ucb * np.sqrt(np.log1p(n.sum()) / (1.0 + n))
        # Never-measured domains: the largest measured signal (optimism), like learning_progress.
        top = np.nanmax(learn) if (~np.isnan(learn)).any() else 1.0
        signal = np.where(np.isnan(learn), top, learn)
        if cfg.learn_room:
            signal = signal * (1.0 - stats.level_pass_rate()[0])
        return (signal + bonus) ** cfg.learn_power + 1e-6


POLICIES: dict[str, type[MixPolicy]] = {
    "uniform": UniformPolicy,
    "static": StaticPolicy,
    "learning_progress": LearningProgressPolicy,
    "target_difficulty": TargetDifficultyPolicy,
    "learnability": LearnabilityPolicy,
}


def make_policy(cfg: MixSettings, domains: list[DomainInfo]) -> MixPolicy:
    if cfg.policy not in POLICIES:
        raise ValueError(
            f"unknown scheduler policy {cfg.policy!r}; choose one of {sorted(POLICIES)}"
        )
    return POLICIES[cfg.policy](cfg, domains)


def static_shares(cfg: MixSettings, domains: list[DomainInfo]) -> np.ndarray:
    """Shares [n_domains] from ``weights`` (globs) or ``tier_weights``; uniform if neither."""
    n = len(domains)
    shares = np.zeros(n)
    if cfg.weights:
        taken = np.zeros(n, dtype=bool)
        for pattern, share in cfg.weights.items():
            hit = np.array([fnmatch.fnmatchcase(d.name, pattern) for d in domains]) & ~taken
            if not hit.any():
                names = [d.name for d in domains[:5]]
                raise ValueError(
                    f"scheduler.weights key {pattern!r} matches no (unclaimed) domain; "
                    f"domains are e.g. {names}"
                )
            shares[hit] = share / hit.sum()
            taken |= hit
        return shares
    if cfg.tier_weights:
        for tier, share in cfg.tier_weights.items():
            hit = np.array([d.tier == tier for d in domains])
            if share > 0 and not hit.any():
                raise ValueError(
                    f"scheduler.tier_weights gives {tier!r} a share but no domain has it"
                )
            if hit.any():
                shares[hit] = share / hit.sum()
        return shares
    return np.full(n, 1.0 / n)


def mix_weights(scores: np.ndarray, floor: float) -> np.ndarray:
    """Normalise ``scores`` [D] into shares that sum to 1 with every share >= ``floor``."""
    n = len(scores)
    total = scores.sum()
    norm = scores / total if total > 0 else np.full(n, 1.0 / n)
    return floor + (1.0 - n * floor) * norm


def allocate(weights: np.ndarray, count: int, rng: np.random.Generator) -> np.ndarray:
    """Systematic sampling: integer counts [D] summing to ``count``, each floor/ceil of w*count."""
    if count <= 0:
        return np.zeros(len(weights), dtype=np.int64)
    live = np.flatnonzero(weights > 0)  # a domain with weight 0 (quarantined) gets nothing
    edges = np.cumsum(weights[live]) / weights[live].sum()
    edges[-1] = 1.0
    points = (rng.random() + np.arange(count)) / count
    picks = live[np.minimum(np.searchsorted(edges, points, side="right"), len(live) - 1)]
    return np.bincount(picks, minlength=len(weights))
