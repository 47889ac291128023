"""Per-domain sampling temperature: a base schedule, and a controller that only heats.

Two temperatures per domain:

* the **base** ``T_base,i``: the domain's ``domain_temperature`` entry when one matches its
  name (a fixed per-domain base, e.g. ``{"math/*": 0.6, "code/*": 1.2}``); otherwise it moves
  linearly from ``temperature`` to ``temperature_end`` over the first
  ``temperature_anneal_groups`` groups *of that domain* (its own training time). The mix groups
  of a step are sampled at it, so what the mix policies steer by is measured at a known
  temperature (``stats.py``).
* the **refill** temperature ``T_i = min(T_base,i * exp(offset_i) * seesaw_i, temperature_max)``
  of the over-sampled groups that refill slots the zero-variance filter dropped. ``offset_i >= 0``
  is a log-space integral controller on a signal that rises with temperature: the share of groups
  with reward variance (``'diversity'``) or the mean token entropy (``'entropy'``, nats/token),
  measured on the heated groups themselves once there are any. It only heats a domain whose
  signal is below ``temperature_target``, ``offset += rate * (target - signal) / target``, and
  never cools below the base (the offset is clipped at 0). ``seesaw_i`` is
  ``seesaw_temperature_scale`` (>= 1) for domains the seesaw guard flagged, else 1.

Deviation from a single global temperature (Polaris, GLM-4.5 raise it as diversity falls): the
heat is per domain, and only on refill groups. The previous version of this controller also
cooled domains whose diversity was above target, which drove learning domains to T ~ 0.65 in the
real benchmark (docs/scheduler.md); Skywork-OR1 reports that a low temperature collapses
entropy faster, so cooling is gone.
"""

from __future__ import annotations

import fnmatch
from typing import Any

import numpy as np

from megatron_rl.scheduler.config import SchedulerConfig
from megatron_rl.scheduler.stats import DomainStats


class TemperatureController:
    """Holds the heat offsets [n_domains] >= 0 and computes base and refill temperatures."""

    def __init__(self, cfg: SchedulerConfig, n_domains: int, names: list[str] | None = None):
        self.cfg = cfg
        self.offset = np.zeros(n_domains)
        self.fixed = np.full(n_domains, np.nan)  # domain_temperature per domain (NaN: none)
        for i, name in enumerate(names or []):
            hit = next(
                (t for p, t in cfg.domain_temperature.items() if fnmatch.fnmatchcase(name, p)),
                None,
            )
            if hit is not None:
                self.fixed[i] = hit

    def base(self, groups_seen: np.ndarray) -> np.ndarray:
        """[D] base temperatures: the fixed per-domain value or the per-domain anneal."""
        cfg = self.cfg
        if cfg.temperature_anneal_groups <= 0:
            temp = np.full(len(groups_seen), cfg.temperature)
        else:
            frac = np.minimum(groups_seen / cfg.temperature_anneal_groups, 1.0)
            temp = cfg.temperature + (cfg.temperature_end - cfg.temperature) * frac
        return np.where(np.isnan(self.fixed), temp, self.fixed)

    def temperatures(self, groups_seen: np.ndarray, flagged: np.ndarray) -> np.ndarray:
        """[D] refill temperatures: base x heat x seesaw scale, never below base or above max."""
        base = self.base(groups_seen)
        scale = np.where(flagged, self.cfg.seesaw_temperature_scale, 1.0)
        hot = base * np.exp(self.offset) * scale
        return np.maximum(np.minimum(hot, self.cfg.temperature_max), base)

    def adapt(self, seen: np.ndarray, stats: DomainStats) -> None:
        """One controller step for the domains observed this step (``seen`` [D] bool)."""
        cfg = self.cfg
        if cfg.temperature_adapt == "none":
            return
        if cfg.temperature_adapt == "entropy":
            signal = stats.ratio("ent", "ent_n")
        else:
            signal = stats.diversity(self.offset > 0)
        ok = seen & ~np.isnan(signal)
        err = (cfg.temperature_target - signal[ok]) / cfg.temperature_target
        limit = float(np.log(cfg.temperature_max / cfg.temperature_min))
        self.offset[ok] = np.clip(self.offset[ok] + cfg.temperature_adapt_rate * err, 0.0, limit)

    def state_dict(self) -> dict[str, Any]:
        return {"offset": self.offset.tolist()}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.offset = np.asarray(sd["offset"], dtype=float)
