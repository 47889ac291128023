"""Seesaw guard: flag a domain whose held-out score fell below its own robust best.

Each eval sweep gives, per domain, one score per eval prompt of a *fixed* eval set (e.g. the
sampled pass@1 of k completions of that prompt). Per domain and sweep the guard:

1. **Counts distinct prompts once.** The RL loop's eval never repeats a prompt
   (``megatron_rl/evaluation/prompt_sets.py``); for callers whose sets may, ``ids`` (one prompt id
   per score) averages the scores of a prompt first, so the bootstrap resamples distinct prompts
   (copies of one prompt would make the interval too narrow).
2. **Compares with a robust best**, not the best single sweep (the maximum of noisy sweeps is
   biased upward): the reference is the per-prompt median over a window of ``seesaw_window``
   consecutive sweeps, the window with the highest mean so far.
3. **Discounts a dip every domain shares**: the median drop of the *other* domains (against
   their own references), when positive, is added back before testing, so a sweep at which every
   domain dips (an optimizer transient) flags nothing.
4. **Tests paired over prompts**: ``d = now - reference + shared dip``; the sweep counts as a
   drop when ``-mean(d) > seesaw_min_drop`` and the one-sided ``1 - seesaw_alpha`` bootstrap
   upper bound of ``mean(d)`` is below 0.
5. **Needs consecutive drops**: ``seesaw_consecutive`` drop sweeps in a row flag the domain
   (event ``regression``). A flagged domain recovers when its discounted drop is back within
   ``seesaw_min_drop / 2`` (event ``recovery``).

While flagged, the scheduler multiplies the domain's mix score by ``seesaw_boost`` (when
``seesaw: true``); the guard runs and emits events either way.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from megatron_rl.scheduler.config import SchedulerConfig


def distinct_scores(values: list[float], ids: list[str] | None) -> np.ndarray:
    """Per-prompt scores [P], averaged over repeats of a prompt id (sorted by id)."""
    x = np.asarray(values, dtype=float)
    if ids is None:
        return x
    if len(ids) != x.size:
        raise ValueError(f"{len(ids)} prompt ids for {x.size} eval scores")
    keys, inverse = np.unique(np.asarray(ids), return_inverse=True)
    return np.bincount(inverse, weights=x) / np.bincount(inverse, minlength=len(keys))


class SeesawGuard:
    """Per domain: reference, recent sweeps, drop streak and regression flag [n_domains]."""

    def __init__(self, cfg: SchedulerConfig, names: list[str]):
        self.cfg = cfg
        self.names = names
        self.pos = {n: i for i, n in enumerate(names)}
        n = len(names)
        self.recent: list[list[list[float]]] = [[] for _ in range(n)]  # last window of sweeps
        self.ref: list[list[float] | None] = [None] * n  # per-prompt robust best
        self.best_mean = np.full(n, np.nan)  # mean of the robust best
        self.start_mean = np.full(n, np.nan)  # first sweep
        self.last_mean = np.full(n, np.nan)  # latest sweep
        self.streak = np.zeros(n, dtype=np.int64)  # consecutive drop sweeps
        self.flagged = np.zeros(n, dtype=bool)

    def observe(
        self,
        scores: dict[str, list[float]],
        rng: np.random.Generator,
        ids: dict[str, list[str]] | None = None,
    ) -> list[dict[str, Any]]:
        """Fold in one sweep; returns 'regression' / 'recovery' events."""
        xs: dict[int, np.ndarray] = {}
        for name, values in scores.items():
            if name not in self.pos:
                raise ValueError(f"eval scores for unknown domain {name!r}")
            if len(values) == 0:
                raise ValueError(f"eval scores for domain {name!r} are empty")
            xs[self.pos[name]] = distinct_scores(values, (ids or {}).get(name))
        drops = {i: self._drop(i, x) for i, x in xs.items()}
        events = []
        for i, x in xs.items():
            others = [d for j, d in drops.items() if j != i and not np.isnan(d)]
            shared = max(0.0, float(np.median(others))) if others and self.cfg.seesaw_common else 0
            event = self._observe_one(i, x, shared, rng)
            if event is not None:
                events.append(event)
        return events

    def _drop(self, i: int, x: np.ndarray) -> float:
        """Reference mean minus this sweep's mean (NaN before the first sweep)."""
        ref = self.ref[i]
        if ref is None:
            return float("nan")
        if len(ref) != x.size:
            raise ValueError(
                f"eval set of domain {self.names[i]!r} changed size ({len(ref)} -> "
                f"{x.size}); the seesaw guard needs a fixed eval set"
            )
        return float(self.best_mean[i] - x.mean())

    def _observe_one(
        self, i: int, x: np.ndarray, shared: float, rng: np.random.Generator
    ) -> dict[str, Any] | None:
        mean = float(x.mean())
        self.last_mean[i] = mean
        if self.ref[i] is None:
            self.start_mean[i] = mean
            self._push(i, x)
            return None
        diff = x - np.asarray(self.ref[i]) + shared
        drop = -float(diff.mean())
        cfg, event = self.cfg, None
        if not self.flagged[i]:
            upper = self._upper(diff, rng) if drop > cfg.seesaw_min_drop else 0.0
            self.streak[i] = self.streak[i] + 1 if upper < 0 else 0
            if self.streak[i] >= cfg.seesaw_consecutive:
                self.flagged[i] = True
                event = self._event(i, "regression", mean, drop, shared, upper)
        elif drop <= cfg.seesaw_min_drop / 2:
            self.flagged[i] = False
            self.streak[i] = 0
            event = self._event(i, "recovery", mean, drop, shared, None)
        self._push(i, x)
        return event

    def _upper(self, diff: np.ndarray, rng: np.random.Generator) -> float:
        """One-sided ``1 - alpha`` bootstrap upper bound of ``mean(diff)`` over prompts."""
        idx = rng.integers(0, diff.size, size=(self.cfg.seesaw_bootstrap, diff.size))
        return float(np.quantile(diff[idx].mean(axis=1), 1.0 - self.cfg.seesaw_alpha))

    def _push(self, i: int, x: np.ndarray) -> None:
        """Add a sweep to the window; the window's per-prompt median becomes the reference when
        its mean is the highest so far."""
        self.recent[i] = [*self.recent[i], x.tolist()][-self.cfg.seesaw_window :]
        cand = np.median(np.asarray(self.recent[i]), axis=0)
        if self.ref[i] is None or cand.mean() > self.best_mean[i]:
            self.ref[i] = cand.tolist()
            self.best_mean[i] = float(cand.mean())

    def _event(
        self, i: int, kind: str, mean: float, drop: float, shared: float, upper: float | None
    ) -> dict[str, Any]:
        event = {
            "event": kind,
            "domain": self.names[i],
            "score": mean,
            "best": float(self.best_mean[i]),
            "drop": drop,
            "shared_dip": shared,
        }
        if upper is not None:
            event["diff_upper_bound"] = upper
        return event

    def state_dict(self) -> dict[str, Any]:
        return {
            "recent": [list(r) for r in self.recent],
            "ref": list(self.ref),
            "best_mean": self.best_mean.tolist(),
            "start_mean": self.start_mean.tolist(),
            "last_mean": self.last_mean.tolist(),
            "streak": self.streak.tolist(),
            "flagged": self.flagged.tolist(),
        }

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.recent = [list(r) for r in sd["recent"]]
        self.ref = list(sd["ref"])
        self.best_mean = np.asarray(sd["best_mean"], dtype=float)
        self.start_mean = np.asarray(sd["start_mean"], dtype=float)
        self.last_mean = np.asarray(sd["last_mean"], dtype=float)
        self.streak = np.asarray(sd["streak"], dtype=np.int64)
        self.flagged = np.asarray(sd["flagged"], dtype=bool)
