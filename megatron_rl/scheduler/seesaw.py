"""Seesaw guard: flag domains whose held-out eval fell below their own best, noise-aware.

Each eval sweep gives, per domain, one score per *distinct prompt* of a fixed eval set (its
greedy score, or the pass rate of its k samples; ``megatron_rl/train/prompt_sets.py`` never
repeats a prompt, so the bootstrap resamples independent units, not copies of one). The guard
keeps the per-prompt scores of the domain's best sweep and tests the paired per-prompt
difference ``now - best`` with a bootstrap over prompts: a domain is
flagged as regressed when the mean drop exceeds ``seesaw_min_drop`` *and* the one-sided
``1 - seesaw_alpha`` bootstrap upper bound of the mean difference is below 0. The pairing
removes task-difficulty variance, so a 64-task set can see drops a raw two-sample test would
miss. A flagged domain recovers when its mean is back within ``seesaw_min_drop / 2`` of the
best (hysteresis against flapping). Deviation from a textbook test: "best" is the max over
noisy sweeps, which biases it upward (winner's curse); we accept the resulting extra flags
because a false flag only costs a temporary boost in mix share.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from megatron_rl.scheduler.config import SchedulerConfig


class SeesawGuard:
    """Best/start/last eval per domain and the regression flags [n_domains]."""

    def __init__(self, cfg: SchedulerConfig, names: list[str]):
        self.cfg = cfg
        self.names = names
        self.pos = {n: i for i, n in enumerate(names)}
        n = len(names)
        self.best: list[list[float] | None] = [None] * n  # per-task scores of the best sweep
        self.best_mean = np.full(n, np.nan)
        self.start_mean = np.full(n, np.nan)  # first sweep
        self.last_mean = np.full(n, np.nan)  # latest sweep
        self.flagged = np.zeros(n, dtype=bool)

    def observe(
        self, scores: dict[str, list[float]], rng: np.random.Generator
    ) -> list[dict[str, Any]]:
        """Fold in one sweep; returns 'regression' / 'recovery' events."""
        events = []
        for name, values in scores.items():
            if name not in self.pos:
                raise ValueError(f"eval scores for unknown domain {name!r}")
            x = np.asarray(values, dtype=float)
            if x.size == 0:
                raise ValueError(f"eval scores for domain {name!r} are empty")
            event = self._observe_one(self.pos[name], x, rng)
            if event is not None:
                events.append(event)
        return events

    def _observe_one(
        self, i: int, x: np.ndarray, rng: np.random.Generator
    ) -> dict[str, Any] | None:
        mean = float(x.mean())
        self.last_mean[i] = mean
        best = self.best[i]
        if best is None:
            self.start_mean[i] = mean
            self._set_best(i, x)
            return None
        if len(best) != x.size:
            raise ValueError(
                f"eval set of domain {self.names[i]!r} changed size ({len(best)} -> {x.size}); "
                "the seesaw guard needs a fixed eval set"
            )
        diff = x - np.asarray(best)
        drop = -float(diff.mean())
        event = None
        if not self.flagged[i] and drop > self.cfg.seesaw_min_drop:
            idx = rng.integers(0, x.size, size=(self.cfg.seesaw_bootstrap, x.size))
            upper = float(np.quantile(diff[idx].mean(axis=1), 1.0 - self.cfg.seesaw_alpha))
            if upper < 0:
                self.flagged[i] = True
                event = self._event(i, "regression", mean, drop, upper)
        elif self.flagged[i] and drop <= self.cfg.seesaw_min_drop / 2:
            self.flagged[i] = False
            event = self._event(i, "recovery", mean, drop, None)
        if mean > self.best_mean[i]:
            self._set_best(i, x)
        return event

    def _set_best(self, i: int, x: np.ndarray) -> None:
        self.best[i] = x.tolist()
        self.best_mean[i] = float(x.mean())

    def _event(
        self, i: int, kind: str, mean: float, drop: float, upper: float | None
    ) -> dict[str, Any]:
        event = {
            "event": kind,
            "domain": self.names[i],
            "score": mean,
            "best": float(self.best_mean[i]),
            "drop": drop,
        }
        if upper is not None:
            event["diff_upper_bound"] = upper
        return event

    def state_dict(self) -> dict[str, Any]:
        return {
            "best": list(self.best),
            "best_mean": self.best_mean.tolist(),
            "start_mean": self.start_mean.tolist(),
            "last_mean": self.last_mean.tolist(),
            "flagged": self.flagged.tolist(),
        }

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.best = list(sd["best"])
        self.best_mean = np.asarray(sd["best_mean"], dtype=float)
        self.start_mean = np.asarray(sd["start_mean"], dtype=float)
        self.last_mean = np.asarray(sd["last_mean"], dtype=float)
        self.flagged = np.asarray(sd["flagged"], dtype=bool)
