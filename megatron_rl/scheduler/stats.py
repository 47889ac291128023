"""Per-domain running statistics, smoothed and with an uncertainty.

All statistics are exponential moving *sums* indexed by domain, decayed per observed group
(``ema_decay ** groups``), not per step: a domain sampled once every ten steps keeps its
memory instead of decaying to nothing, and a domain's effective sample count ``n`` says how
much evidence stands behind its rate. Pass rates are posterior means under a Beta prior of
``prior_strength`` pseudo-samples at 0.5, with the posterior standard deviation as the
uncertainty, so a domain seen on three samples sits near 0.5 with a wide interval instead of
being judged 0/3 or 3/3.

Level-local counts (``lvl_n``, ``lvl_pass``) only take results at the domain's current
difficulty level and are reset by the curriculum when the level changes.

Measured at a known temperature: what the mix policies and the curriculum steer by (the
level-local pass rate and the learnability ``learn`` / ``learn_groups``) only takes groups sampled
at the domain's *base* temperature. Groups the temperature controller heated (``heated``) count
in their own sums (``hot_*``), which only the controller reads; otherwise heating a saturated
domain would raise its measured learnability and so its share of the mix.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from megatron_rl.scheduler.types import GroupResult

SUMS = (
    "n",  # samples
    "passes",  # samples with reward >= pass_threshold
    "rew",  # sum of rewards
    "rew_sq",  # sum of squared rewards
    "groups",  # groups
    "zero_var",  # groups with all rewards equal
    "length",  # sum of response lengths (tokens)
    "trunc",  # truncated samples
    "ent",  # sum of group entropies (nats/token)
    "ent_n",  # groups that reported an entropy
    "lvl_n",  # samples at the current level (base temperature)
    "lvl_pass",  # passes at the current level (base temperature)
    "learn",  # sum over base-temperature groups of mean |reward - group mean|
    "learn_groups",  # groups sampled at the base temperature
    "hot_groups",  # groups sampled above the base temperature (heated refills)
    "hot_zero_var",  # heated groups with all rewards equal
)


class DomainStats:
    """Smoothed statistics of ``n_domains`` domains; every array has shape [n_domains]."""

    def __init__(self, n_domains: int, decay: float, prior_strength: float, threshold: float):
        self.decay, self.prior, self.threshold = decay, prior_strength, threshold
        self.sums = {k: np.zeros(n_domains) for k in SUMS}
        self.fast = np.full(n_domains, np.nan)  # fast EMA of the observed pass rate
        self.slow = np.full(n_domains, np.nan)  # slow EMA of the observed pass rate
        self.groups_seen = np.zeros(n_domains, dtype=np.int64)  # all groups ever observed
        self.measured_seen = np.zeros(n_domains, dtype=np.int64)  # base-temperature groups ever

    def update(
        self, idx: np.ndarray, results: list[GroupResult], at_level: np.ndarray, rates: tuple
    ) -> np.ndarray:
        """Fold one step's results in; ``idx`` [G] maps results to domains, ``at_level`` [G] bool.

        ``rates`` = (lp_fast, lp_slow). Returns the boolean mask [n_domains] of observed domains.
        """
        d = len(self.groups_seen)
        n = np.array([len(r.rewards) for r in results], dtype=float)
        passes = np.array([sum(x >= self.threshold for x in r.rewards) for r in results], float)
        hot = np.array([r.heated for r in results], dtype=float)
        here = np.asarray(at_level, dtype=float) * (1.0 - hot)
        zero = np.array([r.zero_variance for r in results], dtype=float)
        per_group = {  # one value per result, [G]
            "n": n,
            "passes": passes,
            "rew": np.array([sum(r.rewards) for r in results], dtype=float),
            "rew_sq": np.array([sum(x * x for x in r.rewards) for r in results], dtype=float),
            "groups": np.ones(len(results)),
            "zero_var": zero,
            "length": np.array([sum(r.response_lens) for r in results], dtype=float),
            "trunc": np.array([sum(r.truncated) for r in results], dtype=float),
            "ent": np.array([r.entropy or 0.0 for r in results], dtype=float),
            "ent_n": np.array([r.entropy is not None for r in results], dtype=float),
            "lvl_n": n * here,
            "lvl_pass": passes * here,
            "learn": np.array([r.abs_advantage for r in results], dtype=float) * (1.0 - hot),
            "learn_groups": 1.0 - hot,
            "hot_groups": hot,
            "hot_zero_var": zero * hot,
        }
        batch = {k: np.bincount(idx, weights=v, minlength=d) for k, v in per_group.items()}
        seen = batch["groups"] > 0
        factor = self.decay ** batch["groups"][seen]
        for key in SUMS:
            self.sums[key][seen] = factor * self.sums[key][seen] + batch[key][seen]
        self._update_progress(seen, batch, rates)
        self.groups_seen += batch["groups"].astype(np.int64)
        self.measured_seen += np.rint(batch["learn_groups"]).astype(np.int64)
        return seen

    def _update_progress(self, seen: np.ndarray, batch: dict, rates: tuple) -> None:
        rate = batch["passes"][seen] / np.maximum(batch["n"][seen], 1.0)
        groups = batch["groups"][seen]
        for arr, a in ((self.fast, rates[0]), (self.slow, rates[1])):
            old = arr[seen]
            keep = (1.0 - a) ** groups
            arr[seen] = np.where(np.isnan(old), rate, keep * old + (1.0 - keep) * rate)

    def reset_level(self, i: int) -> None:
        """Forget level-local counts and the progress EMAs of domain ``i`` (its level changed)."""
        self.sums["lvl_n"][i] = self.sums["lvl_pass"][i] = 0.0
        self.fast[i] = self.slow[i] = np.nan

    # --- derived quantities, all [n_domains] ------------------------------------------------
    def _beta(self, passes: np.ndarray, n: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        mean = (passes + 0.5 * self.prior) / (n + self.prior)
        return mean, np.sqrt(mean * (1.0 - mean) / (n + self.prior + 1.0))

    def pass_rate(self) -> tuple[np.ndarray, np.ndarray]:
        """Posterior mean and standard deviation of each domain's pass rate (all levels)."""
        return self._beta(self.sums["passes"], self.sums["n"])

    def level_pass_rate(self) -> tuple[np.ndarray, np.ndarray]:
        """Posterior mean and standard deviation of the pass rate at the current level."""
        return self._beta(self.sums["lvl_pass"], self.sums["lvl_n"])

    def ratio(self, num: str, den: str) -> np.ndarray:
        """Smoothed ``num / den`` (NaN where nothing was observed)."""
        den_v = self.sums[den]
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(den_v > 0, self.sums[num] / den_v, np.nan)

    def reward_var(self) -> np.ndarray:
        mean = self.ratio("rew", "n")
        return np.maximum(self.ratio("rew_sq", "n") - mean**2, 0.0)

    def learnability(self) -> np.ndarray:
        """Mean |advantage| per base-temperature group (NaN where none was measured)."""
        return self.ratio("learn", "learn_groups")

    def diversity(self, heated: np.ndarray) -> np.ndarray:
        """Share of groups with reward variance: of the heated groups where ``heated`` [D] and
        some were seen, else of all groups (NaN where nothing was observed)."""
        hot = 1.0 - self.ratio("hot_zero_var", "hot_groups")
        base = 1.0 - self.ratio("zero_var", "groups")
        return np.where(heated & (self.sums["hot_groups"] > 0), hot, base)

    def progress(self, z: float) -> np.ndarray:
        """|fast - slow| pass-rate EMAs minus ``z`` standard errors of noise (>= 0; NaN unseen)."""
        _, sd = self.level_pass_rate()
        return np.maximum(np.abs(self.fast - self.slow) - z * sd, 0.0)

    def state_dict(self) -> dict[str, Any]:
        return {
            "sums": {k: v.tolist() for k, v in self.sums.items()},
            "fast": self.fast.tolist(),
            "slow": self.slow.tolist(),
            "groups_seen": self.groups_seen.tolist(),
            "measured_seen": self.measured_seen.tolist(),
        }

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.sums = {k: np.asarray(sd["sums"][k], dtype=float) for k in SUMS}
        self.fast = np.asarray(sd["fast"], dtype=float)
        self.slow = np.asarray(sd["slow"], dtype=float)
        self.groups_seen = np.asarray(sd["groups_seen"], dtype=np.int64)
        self.measured_seen = np.asarray(sd["measured_seen"], dtype=np.int64)
