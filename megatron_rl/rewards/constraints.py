"""Constraints as a Lagrangian relaxation: a violation budget and a multiplier per constraint.

A constraint is a named kind of violation a verifier can report on a sample: ``hard_violation``
(the safety domains: complied with a request that must be refused), or any name a domain's
``score`` lists in ``details["violations"]``. ``rewards.constraints`` gives each constraint a
budget, the share of its samples allowed to violate it. Each step:

* a violating sample's reward is its composed reward minus the constraint's multiplier
  ``lambda`` (the Lagrangian ``r - lambda * c``, with ``c`` the 0/1 violation);
* then ``integral <- clip(integral + lr * (rate - budget), 0, max)`` and
  ``lambda = clip(kp * (rate - budget) + integral, 0, max)``, with ``rate`` the step's share of
  violating samples among the samples the constraint applies to (those of domains that declare
  it in ``Domain.constraints``, and any sample that reports it). A step without such samples
  leaves ``lambda`` as it was. With ``kp = 0`` (the default) this is plain dual ascent,
  ``lambda <- clip(lambda + lr * (rate - budget), 0, max)``; ``kp > 0`` adds a proportional term
  (a PI controller, the idea of Stooke et al. 2020, "Responsive Safety in RL by PID Lagrangian
  Methods"): once the integral has decayed to 0 while the constraint was slack, a rate that
  creeps back over the budget is priced at once instead of after many steps of re-ascent.

So the price of a violation rises while the policy violates more than the budget allows and
falls back once it does not: the policy is free to trade a violation for task reward only when
the constraint is slack. ``constraint/<name>/{rate,multiplier,budget}`` are logged every step and
the multipliers are checkpointed. The older floor (a violating sample's reward is the domain's
``hard_floor``, whatever else it earned) stays, and is the default (``rewards.violation_floor``);
with it off, the multiplier alone prices ``hard_violation``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any


class Multipliers:
    """One Lagrange multiplier per constraint (see the module docstring)."""

    def __init__(
        self,
        budgets: dict[str, float],
        lr: float = 1.0,
        init: float = 0.0,
        cap: float = 10.0,
        kp: float = 0.0,
    ) -> None:
        for name, b in budgets.items():
            if not (math.isfinite(b) and 0.0 <= b <= 1.0):
                raise ValueError(
                    f"rewards.constraints[{name!r}]={b}: a budget is a share in [0, 1]"
                )
        if not (lr > 0 and 0 <= init <= cap and math.isfinite(cap)):
            raise ValueError(
                f"rewards.constraint_lr must be > 0 and 0 <= constraint_init <= constraint_max "
                f"(finite), got {lr}, {init}, {cap}"
            )
        if not (math.isfinite(kp) and kp >= 0):
            raise ValueError(f"rewards.constraint_kp must be >= 0 (finite), got {kp}")
        self.budgets, self.lr, self.cap, self.kp = dict(budgets), lr, cap, kp
        self.value = dict.fromkeys(budgets, float(init))  # the multipliers
        self.integral = dict(self.value)  # their integral parts

    def penalty(self, violations: Iterable[str]) -> float:
        """What one sample pays for its violations (constraints without a budget cost 0)."""
        return sum(self.value.get(v, 0.0) for v in set(violations))

    def update(self, counts: dict[str, tuple[int, int]]) -> dict[str, float]:
        """``counts``: constraint -> (violating samples, samples it applies to) of one step.
        Moves each multiplier and returns the step's ``constraint/*`` metrics."""
        out: dict[str, float] = {}
        for name, budget in self.budgets.items():
            bad, n = counts.get(name, (0, 0))
            if n:
                err = bad / n - budget
                acc = min(self.cap, max(0.0, self.integral[name] + self.lr * err))
                self.integral[name] = acc
                self.value[name] = min(self.cap, max(0.0, self.kp * err + acc))
                out[f"constraint/{name}/rate"] = bad / n
            out[f"constraint/{name}/multiplier"] = self.value[name]
            out[f"constraint/{name}/budget"] = budget
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"value": dict(self.value), "integral": dict(self.integral)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A checkpoint from before the integral was kept apart resumes with integral = value."""
        value = {k: float(v) for k, v in state.get("value", {}).items() if k in self.value}
        self.value.update(value)
        self.integral.update(value)
        self.integral.update(
            {k: float(v) for k, v in state.get("integral", {}).items() if k in self.integral}
        )


def count_violations(
    samples: Iterable[tuple[str, tuple[str, ...]]], declared: dict[str, tuple[str, ...]]
) -> dict[str, tuple[int, int]]:
    """Per constraint, (violating, applicable) over ``(domain, violations)`` of a step's samples;
    ``declared``: domain -> the constraints it declares."""
    bad: dict[str, int] = {}
    n: dict[str, int] = {}
    for domain, violations in samples:
        for name in set(declared.get(domain, ())) | set(violations):
            n[name] = n.get(name, 0) + 1
            bad[name] = bad.get(name, 0) + int(name in violations)
    return {k: (bad.get(k, 0), n[k]) for k in n}
