"""The small dataclasses the scheduler speaks in: domains, planned groups, group results.

The scheduler knows domains only by name and these descriptors; it never imports the domain
registry or the rollout engine, so it can be driven by the RL loop, the simulator or a test.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Tier = Literal["core", "long_tail"]


@dataclass(frozen=True)
class DomainInfo:
    """A task domain as the scheduler sees it."""

    name: str  # unique domain name, e.g. 'rg/basic_arithmetic'
    tier: Tier = "core"  # 'core' or 'long_tail' (static policy's tier weights)
    levels: list[int] = field(default_factory=lambda: [0])  # difficulty levels, easy -> hard
    tags: list[str] = field(default_factory=list)  # first tag names the radar-chart group


@dataclass(frozen=True)
class GroupSpec:
    """One planned group: a task of ``domain`` at ``level``, sampled at ``temperature``."""

    domain: str
    level: int
    temperature: float
    heated: bool = False  # a refill group sampled above the domain's base temperature


@dataclass
class GroupResult:
    """What came back for one group (one entry per completion in each list)."""

    domain: str
    level: int
    rewards: list[float]  # reward per completion
    response_lens: list[int]  # tokens per completion
    truncated: list[bool]  # completion hit the length limit
    entropy: float | None = None  # mean token entropy of the group (nats/token), if known
    no_signal: bool | None = None  # advantages all 0 (None: zero_variance decides, as in GRPO)
    heated: bool = False  # copied from GroupSpec.heated: not sampled at the base temperature

    @property
    def abs_advantage(self) -> float:
        """Mean |reward - group mean| over the completions (0 for zero-variance groups).

        For 0/1 rewards with ``k`` passes of ``n`` it is ``2 p (1 - p)`` with ``p = k / n``: the
        expected |advantage| of a mean-centred (Dr.GRPO) estimator, and the learnability
        ``p (1 - p)`` of the group's task, up to the factor 2.
        """
        if not self.rewards:
            return 0.0
        mean = sum(self.rewards) / len(self.rewards)
        return sum(abs(r - mean) for r in self.rewards) / len(self.rewards)

    @property
    def zero_variance(self) -> bool:
        """All rewards equal: the group has no group-relative (GRPO) advantage signal."""
        return len(self.rewards) == 0 or max(self.rewards) - min(self.rewards) <= 1e-12

    @property
    def filterable(self) -> bool:
        """The zero-variance filter may drop this group: its advantages carry no signal.

        For group-relative estimators that is zero variance; the loop sets ``no_signal`` for
        estimators where it is not (``passthrough``: equal non-zero rewards still teach).
        """
        return self.zero_variance if self.no_signal is None else self.no_signal
