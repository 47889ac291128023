"""Per-domain sampling temperature: a schedule, optional feedback, bounds.

``T_i = clip(T_sched(g_i) * exp(offset_i) * seesaw_i, temperature_min, temperature_max)``

* ``T_sched`` is a domain's ``domain_temperature`` entry when one matches its name (a fixed
  per-domain base, e.g. ``{"math/*": 0.6, "code/*": 1.2}``); otherwise it moves linearly from
  ``temperature`` to ``temperature_end`` over the first ``temperature_anneal_groups`` groups
  *of that domain* (its own training time, so a rarely sampled domain stays exploratory longer
  than a frequent one).
* ``offset_i`` is a log-space integral controller that keeps a signal near
  ``temperature_target``: the domain's mean token entropy (``'entropy'``, nats/token) or its
  share of groups with reward variance (``'diversity'``). Both rise with temperature, so the
  update is ``offset += rate * (target - signal) / target``, clipped so the product stays in
  bounds.
* flagged (regressed) domains are multiplied by ``seesaw_temperature_scale``.
"""

from __future__ import annotations

import fnmatch
from typing import Any

import numpy as np

from megatron_rl.scheduler.config import SchedulerConfig
from megatron_rl.scheduler.stats import DomainStats


class TemperatureController:
    """Holds the adaptive offsets [n_domains] and computes temperatures [n_domains]."""

    def __init__(self, cfg: SchedulerConfig, n_domains: int, names: list[str] | None = None):
        self.cfg = cfg
        self.offset = np.zeros(n_domains)
        self.limit = float(np.log(cfg.temperature_max / cfg.temperature_min))
        self.fixed = np.full(n_domains, np.nan)  # domain_temperature per domain (NaN: none)
        for i, name in enumerate(names or []):
            hit = next(
                (t for p, t in cfg.domain_temperature.items() if fnmatch.fnmatchcase(name, p)),
                None,
            )
            if hit is not None:
                self.fixed[i] = hit

    def scheduled(self, groups_seen: np.ndarray) -> np.ndarray:
        cfg = self.cfg
        if cfg.temperature_anneal_groups <= 0:
            temp = np.full(len(groups_seen), cfg.temperature)
        else:
            frac = np.minimum(groups_seen / cfg.temperature_anneal_groups, 1.0)
            temp = cfg.temperature + (cfg.temperature_end - cfg.temperature) * frac
        return np.where(np.isnan(self.fixed), temp, self.fixed)

    def temperatures(self, groups_seen: np.ndarray, flagged: np.ndarray) -> np.ndarray:
        scale = np.where(flagged, self.cfg.seesaw_temperature_scale, 1.0)
        temp = self.scheduled(groups_seen) * np.exp(self.offset) * scale
        return np.clip(temp, self.cfg.temperature_min, self.cfg.temperature_max)

    def adapt(self, seen: np.ndarray, stats: DomainStats) -> None:
        """One controller step for the domains observed this step (``seen`` [D] bool)."""
        cfg = self.cfg
        if cfg.temperature_adapt == "none":
            return
        if cfg.temperature_adapt == "entropy":
            signal = stats.ratio("ent", "ent_n")
        else:
            signal = 1.0 - stats.ratio("zero_var", "groups")
        ok = seen & ~np.isnan(signal)
        err = (cfg.temperature_target - signal[ok]) / cfg.temperature_target
        self.offset[ok] = np.clip(
            self.offset[ok] + cfg.temperature_adapt_rate * err, -self.limit, self.limit
        )

    def state_dict(self) -> dict[str, Any]:
        return {"offset": self.offset.tolist()}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.offset = np.asarray(sd["offset"], dtype=float)
