"""Curriculum: per-domain difficulty level, promoted and demoted from the level pass rate.

A domain starts at its lowest level >= ``curriculum_start_level`` (default 0: its easiest). After
``curriculum_min_samples`` (smoothed) samples at its current level it is promoted when the lower
bound ``mean - z * sd`` of the level pass rate is above ``promote_threshold`` and demoted when the
upper bound ``mean + z * sd`` is below ``demote_threshold``. Level-local statistics restart after
each change, which also acts as a cool-down. With ``curriculum: false`` every domain stays at its
start level.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from megatron_rl.scheduler.config import SchedulerConfig
from megatron_rl.scheduler.stats import DomainStats
from megatron_rl.scheduler.types import DomainInfo


class Curriculum:
    """Current level index per domain, [n_domains] ints into ``DomainInfo.levels`` (sorted)."""

    def __init__(self, cfg: SchedulerConfig, domains: list[DomainInfo]):
        self.cfg = cfg
        self.levels = [sorted(d.levels) for d in domains]
        self.names = [d.name for d in domains]
        start = cfg.curriculum_start_level
        self.index = np.array(
            [
                next((k for k, lv in enumerate(lvs) if lv >= start), len(lvs) - 1)
                for lvs in self.levels
            ],
            dtype=np.int64,
        )

    def level(self, i: int) -> int:
        return self.levels[i][int(self.index[i])]

    def current_levels(self) -> np.ndarray:
        return np.array([lv[k] for lv, k in zip(self.levels, self.index, strict=True)])

    def update(self, seen: np.ndarray, stats: DomainStats) -> list[dict[str, Any]]:
        """Promote/demote observed domains; returns one event dict per level change."""
        if not self.cfg.curriculum:
            return []
        cfg = self.cfg
        mean, sd = stats.level_pass_rate()
        ready = seen & (stats.sums["lvl_n"] >= cfg.curriculum_min_samples)
        top = np.array([self._top(lvs) for lvs in self.levels])
        up = ready & (mean - cfg.confidence_z * sd > cfg.promote_threshold) & (self.index < top)
        down = ready & (mean + cfg.confidence_z * sd < cfg.demote_threshold) & (self.index > 0)
        events = []
        for i in np.flatnonzero(up | down):
            old = self.level(i)
            self.index[i] += 1 if up[i] else -1
            stats.reset_level(int(i))
            events.append(
                {
                    "event": "promote" if up[i] else "demote",
                    "domain": self.names[i],
                    "from_level": old,
                    "to_level": self.level(i),
                    "pass_rate": float(mean[i]),
                }
            )
        return events

    def _top(self, levels: list[int]) -> int:
        """Index of the highest level a domain may be promoted to (``curriculum_max_level``)."""
        cap = self.cfg.curriculum_max_level
        if cap < 0:
            return len(levels) - 1
        return max([k for k, lv in enumerate(levels) if lv <= cap], default=0)

    def state_dict(self) -> dict[str, Any]:
        return {"index": self.index.tolist()}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.index = np.asarray(sd["index"], dtype=np.int64)
