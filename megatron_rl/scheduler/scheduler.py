"""The domain scheduler: which domains, at what level and temperature, and which groups to train.

One step of the RL loop talks to it four times::

    specs = sched.plan(step, num_groups)        # ceil(num_groups * oversample) if filtering
    ...generate and score every spec, in order...
    sched.observe(step, results)                # all results, same order as specs
    kept = sched.select(results, num_groups)    # indices of the groups to train on
    events = sched.observe_eval(step, scores)   # at eval sweeps: per-domain per-task scores

``plan`` lists the ``num_groups`` primary groups first (the mix), then the extra ones that
refill groups the zero-variance filter drops. ``select`` keeps a primary group unless its
rewards are all equal, refills each dropped slot from an unused extra of the *same* domain if
there is one (so the mix survives filtering), then from any unused extra, and only as a last
resort from zero-variance groups, so the trained batch always has ``num_groups`` groups.

Events (curriculum ``promote``/``demote`` from ``observe``, seesaw ``regression``/``recovery``
from ``observe_eval``) are returned as fresh dicts ``{"event": kind, "domain": ..., ...}`` that
the loop may hand to its tracker as ``tracker.event(step, e.pop("event"), **e)``; the history,
with the step added, stays in ``sched.events`` and in the checkpoint.

Everything random draws from one ``numpy`` generator whose state is in ``state_dict()``, so a
reloaded scheduler produces the same plans as the one that was saved.
"""

from __future__ import annotations

import fnmatch
import math
from pathlib import Path
from typing import Any

import numpy as np

from megatron_rl.scheduler.config import TIERS, SchedulerConfig
from megatron_rl.scheduler.curriculum import Curriculum
from megatron_rl.scheduler.policies import allocate, make_policy, mix_weights
from megatron_rl.scheduler.seesaw import SeesawGuard
from megatron_rl.scheduler.stats import DomainStats
from megatron_rl.scheduler.temperature import TemperatureController
from megatron_rl.scheduler.types import DomainInfo, GroupResult, GroupSpec

STATE_VERSION = 2  # 2: robust seesaw reference, learnability sums


def check_domains(cfg: SchedulerConfig, domains: list[DomainInfo]) -> None:
    """Checks of the config against the domain list (ValueError naming the problem)."""
    if not domains:
        raise ValueError("the scheduler needs at least one domain")
    names = [d.name for d in domains]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"duplicate domain names: {dup[:5]}")
    for d in domains:
        if d.tier not in TIERS:
            raise ValueError(f"domain {d.name!r} has tier {d.tier!r}; tiers: {list(TIERS)}")
        if not d.levels:
            raise ValueError(f"domain {d.name!r} has no difficulty levels")
    for pattern in cfg.domain_temperature:
        if not any(fnmatch.fnmatchcase(n, pattern) for n in names):
            raise ValueError(
                f"scheduler.domain_temperature key {pattern!r} matches no domain; "
                f"domains: {names[:8]}"
            )
    if cfg.floor * len(domains) > 1.0 + 1e-9:
        raise ValueError(
            f"scheduler.floor={cfg.floor} times {len(domains)} domains is above 1; "
            f"use floor <= {1.0 / len(domains):.6g}"
        )


class DomainScheduler:
    """Mix, temperature, curriculum, zero-variance filter and seesaw guard over named domains."""

    def __init__(self, cfg: SchedulerConfig, domains: list[DomainInfo], seed: int):
        cfg.validate()
        check_domains(cfg, domains)
        self.cfg, self.domains = cfg, list(domains)
        self.names = [d.name for d in domains]
        self.pos = {n: i for i, n in enumerate(self.names)}
        n = len(domains)
        self.rng = np.random.default_rng(seed)
        self.stats = DomainStats(n, cfg.ema_decay, cfg.prior_strength, cfg.pass_threshold)
        self.policy = make_policy(cfg, self.domains)
        self.temps = TemperatureController(cfg, n, self.names)
        self.curriculum = Curriculum(cfg, self.domains)
        self.guard = SeesawGuard(cfg, self.names)
        self.drop = np.zeros((2, n))  # EMA sums of [dropped, generated] groups per domain
        self.events: list[dict[str, Any]] = []  # history: {"step", "event", "domain", ...}
        self.weights = mix_weights(self.policy.scores(self.stats), cfg.floor)
        self.excluded = np.zeros(n, bool)  # quarantined domains: never planned again

    def exclude(self, name: str) -> None:
        """Stop planning ``name`` (a quarantined domain, or one the pre-screen found without
        reward variance); the others share its weight."""
        if name not in self.pos:
            raise ValueError(f"exclude: unknown domain {name!r}")
        if self.excluded.sum() + (not self.excluded[self.pos[name]]) >= len(self.names):
            raise RuntimeError(f"every domain is quarantined (the last: {name}); nothing to train")
        self.excluded[self.pos[name]] = True

    # --- the four calls of a step --------------------------------------------------------------
    def mix(self) -> np.ndarray:
        """Current shares [n_domains] (sum 1, each >= floor); recomputed every plan."""
        scores = self.policy.scores(self.stats)
        if self.cfg.seesaw:
            scores = scores * np.where(self.guard.flagged, self.cfg.seesaw_boost, 1.0)
        if self.cfg.lag_boost > 0:
            scores = scores * self._lag_factor()
        self.weights = mix_weights(scores, self.cfg.floor)
        if self.excluded.any():
            w = np.where(self.excluded, 0.0, self.weights)
            self.weights = w / w.sum()
        return self.weights

    def _lag_factor(self) -> np.ndarray:
        """[D] ``exp(lag_boost * (median eval - eval))`` for domains below the median eval, else 1.

        Guards the worst domains across the board (group-DRO style), where the seesaw guard only
        compares a domain with its own best: a domain held down by interference from the start
        never regresses from a best, but stays below its peers.
        """
        last = self.guard.last_mean
        ok = ~np.isnan(last)
        if not ok.any():
            return np.ones(len(last))
        lag = np.where(ok, np.maximum(np.median(last[ok]) - last, 0.0), 0.0)
        return np.exp(self.cfg.lag_boost * lag)

    def temperatures(self) -> np.ndarray:
        """[D] refill temperatures (base x controller heat x seesaw scale; >= base)."""
        flagged = self.guard.flagged if self.cfg.seesaw else np.zeros(len(self.names), bool)
        return self.temps.temperatures(self.stats.groups_seen, flagged)

    def plan(self, step: int, num_groups: int) -> list[GroupSpec]:
        """``num_groups`` primary groups (shuffled, at each domain's base temperature), then the
        over-sampled refill groups (at the refill temperature, ``heated`` when above base)."""
        if num_groups <= 0:
            raise ValueError(f"num_groups must be > 0, got {num_groups}")
        weights = self.mix()
        base = self.temps.base(self.stats.groups_seen)
        hot = self.temperatures()
        extra = 0  # refill groups exist only for the zero-variance filter
        if self.cfg.filter_zero_variance:
            extra = math.ceil(num_groups * self.cfg.oversample) - num_groups
        specs: list[GroupSpec] = []
        for count, temps in ((num_groups, base), (extra, hot)):
            counts = allocate(weights, count, self.rng)
            idx = np.repeat(np.arange(len(self.names)), counts)
            self.rng.shuffle(idx)
            specs += [
                GroupSpec(
                    self.names[i],
                    self.curriculum.level(i),
                    float(temps[i]),
                    bool(temps[i] > base[i] * (1 + 1e-9)),
                )
                for i in idx
            ]
        return specs

    def observe(self, step: int, results: list[GroupResult]) -> list[dict[str, Any]]:
        """Update statistics, temperatures and levels from every generated group."""
        if not results:
            return []
        idx = self._indices(results)
        levels = self.curriculum.current_levels()
        at_level = np.array([r.level == levels[i] for i, r in zip(idx, results, strict=True)])
        rates = (self.cfg.lp_fast, self.cfg.lp_slow)
        seen = self.stats.update(idx, results, at_level, rates)
        self.temps.adapt(seen, self.stats)
        return self._record(step, self.curriculum.update(seen, self.stats))

    def select(self, results: list[GroupResult], num_groups: int) -> list[int]:
        """Indices (sorted) of ``num_groups`` groups to train on; see the module docstring."""
        if len(results) < num_groups:
            raise ValueError(f"select needs >= {num_groups} results, got {len(results)}")
        if not self.cfg.filter_zero_variance:
            return list(range(num_groups))
        zero = [r.filterable for r in results]
        kept = [i for i in range(num_groups) if not zero[i]]
        spare = [i for i in range(num_groups, len(results)) if not zero[i]]
        for i in range(num_groups):
            if zero[i] and len(kept) < num_groups:
                same = next((j for j in spare if results[j].domain == results[i].domain), None)
                if same is not None:
                    spare.remove(same)
                    kept.append(same)
        kept += spare[: num_groups - len(kept)]
        fill = [i for i in range(len(results)) if zero[i]]
        kept += fill[: num_groups - len(kept)]
        self._record_drops(results, set(kept))
        return sorted(kept)

    def observe_eval(
        self,
        step: int,
        scores: dict[str, list[float]],
        ids: dict[str, list[str]] | None = None,
    ) -> list[dict[str, Any]]:
        """Fold in an eval sweep (per-domain per-prompt scores; ``ids``: the prompt id of each
        score, so that repeats of a prompt count once); returns seesaw events."""
        return self._record(step, self.guard.observe(scores, self.rng, ids))

    # --- observability -------------------------------------------------------------------------
    def _record(self, step: int, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Keep ``{"step", **event}`` in the history; return copies the caller may mutate."""
        self.events += [{"step": step, **e} for e in events]
        return [dict(e) for e in events]

    def _indices(self, results: list[GroupResult]) -> np.ndarray:
        try:
            return np.array([self.pos[r.domain] for r in results], dtype=np.int64)
        except KeyError as e:
            raise ValueError(f"result for unknown domain {e.args[0]!r}") from None

    def _record_drops(self, results: list[GroupResult], kept: set[int]) -> None:
        idx = self._indices(results)
        gen = np.bincount(idx, minlength=len(self.names)).astype(float)
        # dropped = filtered for zero variance (unused extras with signal do not count)
        dropped_idx = [d for k, d in enumerate(idx) if k not in kept and results[k].filterable]
        dropped = np.bincount(np.array(dropped_idx, dtype=np.int64), minlength=len(self.names))
        seen = gen > 0
        factor = self.cfg.ema_decay ** gen[seen]
        self.drop[0, seen] = factor * self.drop[0, seen] + dropped[seen]
        self.drop[1, seen] = factor * self.drop[1, seen] + gen[seen]

    def metrics(self) -> dict[str, float]:
        """Flat W&B dict: ``sched/<domain>/<stat>`` plus ``sched/<stat>`` totals.

        Per domain: weight (share of the next batch), temperature (of refill groups),
        base_temperature (of mix groups), level, pass_rate (posterior mean), learnability (mean
        |advantage| per base-temperature group), reward_mean, reward_var, zero_var_frac,
        drop_rate (zero-variance groups filtered / generated), response_len (tokens),
        trunc_rate, entropy (nats/token), eval (last sweep mean), flagged (1 while the seesaw
        guard holds a regression).
        """
        pass_rate, _ = self.stats.pass_rate()
        with np.errstate(invalid="ignore", divide="ignore"):
            drop_rate = np.where(self.drop[1] > 0, self.drop[0] / self.drop[1], np.nan)
        per_domain = {
            "weight": self.weights,
            "temperature": self.temperatures(),
            "base_temperature": self.temps.base(self.stats.groups_seen),
            "level": self.curriculum.current_levels(),
            "pass_rate": pass_rate,
            "learnability": self.stats.learnability(),
            "reward_mean": self.stats.ratio("rew", "n"),
            "reward_var": self.stats.reward_var(),
            "zero_var_frac": self.stats.ratio("zero_var", "groups"),
            "drop_rate": drop_rate,
            "response_len": self.stats.ratio("length", "n"),
            "trunc_rate": self.stats.ratio("trunc", "n"),
            "entropy": self.stats.ratio("ent", "ent_n"),
            "eval": self.guard.last_mean,
            "flagged": self.guard.flagged.astype(float),
        }
        out = {  # NaN (never observed / never evaluated) entries are left out
            f"sched/{name}/{key}": float(values[i])
            for key, values in per_domain.items()
            for i, name in enumerate(self.names)
            if not np.isnan(values[i])
        }
        w = self.weights[self.weights > 0]
        out["sched/mix_entropy"] = float(-(w * np.log(w)).sum())
        out["sched/num_flagged"] = float(self.guard.flagged.sum())
        if (~np.isnan(self.guard.last_mean)).any():
            out["sched/eval_mean"] = float(np.nanmean(self.guard.last_mean))
        return out

    def radar_png(self, path: str | Path) -> Path:
        """Capability radar chart (eval now vs start, one axis per domain group) as a PNG."""
        from megatron_rl.scheduler.radar import radar_png

        return radar_png(self.domains, self.guard.start_mean, self.guard.last_mean, path)

    # --- checkpointing -------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Plain-Python state (lists, floats, the RNG state); resumes exactly."""
        return {
            "version": STATE_VERSION,
            "names": list(self.names),
            "rng": self.rng.bit_generator.state,
            "stats": self.stats.state_dict(),
            "temps": self.temps.state_dict(),
            "curriculum": self.curriculum.state_dict(),
            "guard": self.guard.state_dict(),
            "drop": self.drop.tolist(),
            "events": list(self.events),
            "weights": self.weights.tolist(),
            "excluded": [n for n, x in zip(self.names, self.excluded, strict=True) if x],
        }

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        if sd.get("version") != STATE_VERSION:
            raise ValueError(f"scheduler state version {sd.get('version')} != {STATE_VERSION}")
        if sd["names"] != self.names:
            missing = sorted(set(sd["names"]) ^ set(self.names))[:5]
            raise ValueError(
                "scheduler state was saved with a different domain list "
                f"(differing names, e.g. {missing}, or a different order)"
            )
        self.rng.bit_generator.state = sd["rng"]
        self.stats.load_state_dict(sd["stats"])
        self.temps.load_state_dict(sd["temps"])
        self.curriculum.load_state_dict(sd["curriculum"])
        self.guard.load_state_dict(sd["guard"])
        self.drop = np.asarray(sd["drop"], dtype=float)
        self.events = list(sd["events"])
        self.weights = np.asarray(sd["weights"], dtype=float)
        self.excluded = np.array([n in set(sd.get("excluded", [])) for n in self.names], bool)
