"""Domain scheduler settings.

Every knob of the mix, temperature, curriculum, zero-variance filter and seesaw guard lives
here. ``validate()`` checks what can be checked without the domain list; checks that need it
(floor * n_domains <= 1, weight patterns that match no domain) run when
:class:`~megatron_rl.scheduler.DomainScheduler` is built, also as ``ValueError``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from megatron_rl.scheduler.policies import POLICIES

TIERS = ("core", "long_tail")
TEMPERATURE_ADAPT = ("none", "entropy", "diversity")


@dataclass
class SchedulerConfig:
    """How the per-step task mix, temperatures and difficulty levels are chosen across domains."""

    # --- mix -----------------------------------------------------------------------------
    policy: str = "uniform"  # registered mix policy: uniform, static, learning_progress, ...
    weights: dict[str, float] = field(default_factory=dict)  # static: share per name/glob, sum 1
    tier_weights: dict[str, float] = field(default_factory=dict)  # static: share per tier, sum 1
    floor: float = 0.0  # minimum share of groups every domain keeps (fraction of the batch)
    # --- statistics ------------------------------------------------------------------------
    pass_threshold: float = 0.5  # a reward >= this counts as a pass (reward units)
    ema_decay: float = 0.9  # per-group decay of a domain's running stats (memory ~1/(1-d) groups)
    prior_strength: float = 2.0  # pseudo-samples at pass rate 0.5 (shrinks small-sample rates)
    # --- learning-progress policy ------------------------------------------------------------
    lp_fast: float = 0.3  # per-group EMA rate of the fast pass-rate average
    lp_slow: float = 0.05  # per-group EMA rate of the slow pass-rate average
    lp_explore: float = 0.05  # UCB bonus coefficient for rarely sampled domains (pass-rate units)
    # --- target-difficulty policy ------------------------------------------------------------
    target_low: float = 0.2  # lower edge of the informative pass-rate band
    target_high: float = 0.8  # upper edge of the informative pass-rate band
    target_min_score: float = 0.05  # score of a domain at pass rate 0 or 1 (relative to in-band)
    confidence_z: float = 1.0  # standard errors used for optimistic/lower bounds on pass rates
    # --- learnability policy -----------------------------------------------------------------
    learn_ucb: float = 0.05  # UCB bonus coefficient (units of mean |advantage| per group)
    learn_room: bool = False  # x (1 - level pass rate): favour domains with room left to gain
    learn_power: float = 1.0  # shares ~ (signal + bonus) ** learn_power (> 1 concentrates)
    # --- temperature -------------------------------------------------------------------------
    temperature: float = 1.0  # sampling temperature a domain starts at
    temperature_end: float = 1.0  # temperature after temperature_anneal_groups groups
    temperature_anneal_groups: int = 0  # groups of one domain to go start -> end (0: constant)
    temperature_min: float = 0.3  # lower bound on every domain's temperature
    temperature_max: float = 1.5  # upper bound on every domain's temperature
    domain_temperature: dict[str, float] = field(default_factory=dict)  # name/glob -> fixed
    # base temperature of matching domains (first match wins), instead of temperature/_end
    temperature_adapt: str = "none"  # 'none', 'entropy' (nats/token) or 'diversity' adaptation
    temperature_target: float = 0.0  # target entropy (nats/token) or nonzero-variance group share
    temperature_adapt_rate: float = 0.05  # log-temperature change per step per unit rel. error
    # --- curriculum --------------------------------------------------------------------------
    curriculum: bool = False  # promote/demote difficulty levels per domain
    promote_threshold: float = 0.8  # promote when the pass rate's lower bound is above this
    demote_threshold: float = 0.1  # demote when the pass rate's upper bound is below this
    curriculum_min_samples: int = 64  # samples at the current level before a level change
    curriculum_start_level: int = 0  # each domain starts at its lowest level >= this (else top)
    curriculum_max_level: int = -1  # never promote a domain above this level (-1: its top level)
    # --- zero-variance filter ------------------------------------------------------------------
    filter_zero_variance: bool = False  # drop groups whose rewards are all equal and refill
    oversample: float = 1.0  # generated / trained groups when filtering (extras refill drops)
    prescreen_groups: int = 0  # before step 0, this many groups per domain at the base policy;
    # the mix then plans only the domains with reward variance in one of them (0: off; charged
    # to the rollout budget; megatron_rl/controller/prescreen.py)
    fill_batch: bool = False  # refill short: also train the zero-variance groups that fill the
    # batch (advantage 0, they only count in the loss normaliser) so every step trains exactly
    # rl.prompts_per_step groups; false: train only the groups with signal
    # --- dynamic sampling (DAPO, arXiv 2503.14476) ---------------------------------------------
    dynamic_sampling: bool = False  # generate rounds of rl.prompts_per_step groups until
    # dynamic_target groups with reward variance are in hand (or dynamic_max_rounds rounds ran),
    # then train the first dynamic_target of them; needs filter_zero_variance, on-policy only
    dynamic_target: int = 0  # groups with signal trained per step (0: rl.prompts_per_step)
    dynamic_max_rounds: int = 8  # generation rounds per step at most
    # --- seesaw guard --------------------------------------------------------------------------
    seesaw: bool = False  # boost domains the guard flags (the guard itself always runs)
    seesaw_min_drop: float = 0.02  # smallest drop below the robust best that counts (score)
    seesaw_alpha: float = 0.05  # one-sided bootstrap significance of a drop (over prompts)
    seesaw_bootstrap: int = 200  # bootstrap resamples per domain per eval sweep
    seesaw_window: int = 3  # sweeps whose per-prompt median forms the robust best
    seesaw_consecutive: int = 2  # drop sweeps in a row that flag a regression
    seesaw_common: bool = True  # discount the median drop of the other domains (a shared dip)
    seesaw_boost: float = 3.0  # weight multiplier of a flagged domain until it recovers
    seesaw_temperature_scale: float = 1.0  # refill temperature multiplier of a flagged domain
    # (>= 1: heats only)
    lag_boost: float = 0.0  # score x exp(lag_boost * (median eval - eval)) below the median; 0 off

    def validate(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(
                f"scheduler.policy={self.policy!r} is not registered; choose one of "
                f"{sorted(POLICIES)}"
            )
        self._validate_weights()
        if not 0.0 <= self.floor < 1.0:
            raise ValueError(f"scheduler.floor={self.floor} must be in [0, 1)")
        self._validate_temperatures()
        self._validate_ranges()
        if self.dynamic_sampling and not self.filter_zero_variance:
            raise ValueError(
                "scheduler.dynamic_sampling needs scheduler.filter_zero_variance: true (it "
                "generates until enough groups with reward variance are in hand)"
            )
        if self.prescreen_groups < 0:
            raise ValueError(
                f"scheduler.prescreen_groups must be >= 0 (0: no pre-screen), got "
                f"{self.prescreen_groups}"
            )
        if self.dynamic_target < 0 or self.dynamic_max_rounds < 1:
            raise ValueError(
                f"scheduler.dynamic_target must be >= 0 (0: rl.prompts_per_step) and "
                f"scheduler.dynamic_max_rounds >= 1, got {self.dynamic_target} and "
                f"{self.dynamic_max_rounds}"
            )

    def _validate_weights(self) -> None:
        if self.weights and self.tier_weights:
            raise ValueError("scheduler: set weights or tier_weights, not both")
        for key, table in (("weights", self.weights), ("tier_weights", self.tier_weights)):
            if not table:
                continue
            bad = {k: v for k, v in table.items() if v < 0 or not math.isfinite(v)}
            if bad:
                raise ValueError(f"scheduler.{key} must be finite and >= 0, got {bad}")
            total = sum(table.values())
            if abs(total - 1.0) > 1e-6:
                raise ValueError(f"scheduler.{key} must sum to 1, got {total:.6g} from {table}")
        unknown = sorted(set(self.tier_weights) - set(TIERS))
        if unknown:
            raise ValueError(
                f"scheduler.tier_weights has unknown tier {unknown[0]!r}; tiers: {list(TIERS)}"
            )

    def _validate_temperatures(self) -> None:
        for key in ("temperature", "temperature_end", "temperature_min", "temperature_max"):
            value = getattr(self, key)
            if not value > 0:
                raise ValueError(f"scheduler.{key}={value} must be > 0")
        lo, hi = self.temperature_min, self.temperature_max
        if lo > hi:
            raise ValueError(f"scheduler.temperature_min={lo} is above temperature_max={hi}")
        values = {k: getattr(self, k) for k in ("temperature", "temperature_end")}
        values.update({f"domain_temperature.{k}": v for k, v in self.domain_temperature.items()})
        for key, value in values.items():
            if not lo <= value <= hi:
                raise ValueError(
                    f"scheduler.{key}={value} is outside "
                    f"[temperature_min, temperature_max] = [{lo}, {hi}]"
                )
        if self.temperature_adapt not in TEMPERATURE_ADAPT:
            raise ValueError(
                f"scheduler.temperature_adapt={self.temperature_adapt!r}; choose one of "
                f"{list(TEMPERATURE_ADAPT)}"
            )
        if self.temperature_adapt != "none" and self.temperature_target <= 0:
            raise ValueError("scheduler.temperature_target must be > 0 when adapting temperature")
        if self.seesaw_temperature_scale < 1:
            raise ValueError(
                f"scheduler.seesaw_temperature_scale={self.seesaw_temperature_scale} must be >= 1 "
                "(the refill temperature never goes below the base)"
            )

    def _validate_ranges(self) -> None:
        unit = {
            "ema_decay": self.ema_decay,
            "lp_fast": self.lp_fast,
            "lp_slow": self.lp_slow,
            "seesaw_alpha": self.seesaw_alpha,
        }
        for key, value in unit.items():
            if not 0.0 < value < 1.0:
                raise ValueError(f"scheduler.{key}={value} must be in (0, 1)")
        if not 0.0 <= self.target_low < self.target_high <= 1.0:
            raise ValueError(
                f"scheduler: need 0 <= target_low < target_high <= 1, got "
                f"{self.target_low}, {self.target_high}"
            )
        if not 0.0 <= self.demote_threshold < self.promote_threshold <= 1.0:
            raise ValueError(
                f"scheduler: need 0 <= demote_threshold < promote_threshold <= 1, got "
                f"{self.demote_threshold}, {self.promote_threshold}"
            )
        if self.curriculum_start_level < 0:
            raise ValueError(
                f"scheduler.curriculum_start_level={self.curriculum_start_level} must be >= 0"
            )
        if self.curriculum_max_level != -1 and (
            self.curriculum_max_level < self.curriculum_start_level
        ):
            raise ValueError(
                f"scheduler.curriculum_max_level={self.curriculum_max_level} must be -1 (each "
                f"domain's top) or >= curriculum_start_level={self.curriculum_start_level}"
            )
        if self.oversample < 1.0:
            raise ValueError(f"scheduler.oversample={self.oversample} must be >= 1")
        if self.seesaw_boost < 1.0:
            raise ValueError(f"scheduler.seesaw_boost={self.seesaw_boost} must be >= 1")
        if self.lag_boost < 0:
            raise ValueError(f"scheduler.lag_boost={self.lag_boost} must be >= 0")
        for key in ("seesaw_window", "seesaw_consecutive"):
            if getattr(self, key) < 1:
                raise ValueError(f"scheduler.{key}={getattr(self, key)} must be >= 1")
        if self.learn_ucb < 0:
            raise ValueError(f"scheduler.learn_ucb={self.learn_ucb} must be >= 0")
        if not 0.0 < self.learn_power <= 8.0:
            raise ValueError(f"scheduler.learn_power={self.learn_power} must be in (0, 8]")
        if self.seesaw_bootstrap < 10:
            raise ValueError(f"scheduler.seesaw_bootstrap={self.seesaw_bootstrap} must be >= 10")
        if self.prior_strength <= 0:
            raise ValueError(f"scheduler.prior_strength={self.prior_strength} must be > 0")
