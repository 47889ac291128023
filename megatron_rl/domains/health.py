"""Per-domain failure counts and the quarantine: no single domain can stop a run.

Every call into a domain's code (a task draw, a verification) and every prompt the run's model
cannot hold ends in an outcome; :class:`DomainHealth` counts the failures per domain and kind:

- ``too_long``: a prompt longer than the policy's context minus the response budget (found at
  generation, after the start-up fit check let the domain in: a rare long sample);
- ``generate_timeout`` / ``generate_error``: a task draw past its deadline, or that raised;
- ``verify_timeout`` / ``verify_error``: a verification past its deadline, or that raised
  (``Domain.verify`` catches a scorer's exceptions itself; this counts a plugin that overrides
  ``verify`` and raises anyway, or whose worker died).

The group such a failure belongs to is dropped (never trained on with a made-up reward), and the
counts go to ``metrics.jsonl`` / W&B as ``health/<domain>/<kind>`` (cumulative) beside
``health/failures`` and ``health/quarantined``. A domain with at least ``min_failures`` failures
that make up at least ``max_failure_rate`` of its calls is quarantined: one log line and a
``quarantine`` event; the scheduler stops planning it, and its remaining calls are skipped. A
failure of the machinery itself (the engine, the trainer, every worker at once) is not a
domain's: it still stops the run.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)
KINDS = ("too_long", "generate_timeout", "generate_error", "verify_timeout", "verify_error")


@dataclass
class DomainHealth:
    """Failure counts per (domain, kind), calls per domain, and the quarantined set."""

    max_failure_rate: float = 0.5  # quarantine at this share of failed calls ...
    min_failures: int = 3  # ... once a domain has at least this many failures
    calls: Counter[str] = field(default_factory=Counter)
    failures: dict[str, Counter[str]] = field(default_factory=dict)
    quarantined: dict[str, str] = field(default_factory=dict)  # domain -> why
    new: list[dict[str, Any]] = field(default_factory=list)  # quarantine events not yet logged
    last: dict[str, str] = field(default_factory=dict)  # domain -> its last failure's message
    lock: Any = field(default_factory=threading.RLock, repr=False)  # the
    # off-policy generation thread counts while the loop reads the metrics

    def ok(self, domain: str) -> None:
        with self.lock:
            self.calls[domain] += 1

    def fail(self, domain: str, kind: str, message: str = "") -> None:
        """Count one failure of ``kind`` (one of KINDS); quarantine the domain if it is due."""
        if kind not in KINDS:
            raise ValueError(f"failure kind must be one of {KINDS}, got {kind!r}")
        with self.lock:
            self._fail(domain, kind, message)

    def _fail(self, domain: str, kind: str, message: str) -> None:
        self.calls[domain] += 1
        per = self.failures.setdefault(domain, Counter())
        per[kind] += 1
        if message:
            self.last[domain] = message
        n = sum(per.values())
        rate = n / self.calls[domain]
        if (
            domain not in self.quarantined
            and n >= self.min_failures
            and rate >= self.max_failure_rate
        ):
            top = per.most_common(1)[0][0]
            why = f"{n} failures in {self.calls[domain]} calls ({top}): {self.last.get(domain, '')}"
            self.quarantined[domain] = why
            self.new.append({"event": "quarantine", "domain": domain, "reason": why})
            log.warning("quarantined %s: %s; the run goes on without it", domain, why)

    def is_quarantined(self, domain: str) -> bool:
        return domain in self.quarantined

    def record(self, domain: str, stage: str, outcome: Any) -> bool:
        """Count a worker outcome of ``stage`` ('generate' or 'verify'); True if it succeeded.
        A call skipped because the domain is already quarantined counts nowhere."""
        if outcome.ok:
            self.ok(domain)
            return True
        if outcome.failure != "skipped":
            kind = "timeout" if outcome.failure == "timeout" else "error"
            self.fail(domain, f"{stage}_{kind}", outcome.message)
        return False

    def take_events(self) -> list[dict[str, Any]]:
        with self.lock:
            out, self.new = self.new, []
        return out

    def metrics(self) -> dict[str, float]:
        with self.lock:
            return self._metrics()

    def _metrics(self) -> dict[str, float]:
        out = {
            f"health/{d}/{k}": float(v) for d, per in self.failures.items() for k, v in per.items()
        }
        out["health/failures"] = float(sum(sum(p.values()) for p in self.failures.values()))
        out["health/quarantined"] = float(len(self.quarantined))
        return out

    def summary(self) -> dict[str, Any]:
        with self.lock:
            return self._summary()

    def _summary(self) -> dict[str, Any]:
        return {
            "failures": {d: dict(per) for d, per in sorted(self.failures.items())},
            "quarantined": dict(sorted(self.quarantined.items())),
        }

    def state_dict(self) -> dict[str, Any]:
        with self.lock:
            return self._state()

    def _state(self) -> dict[str, Any]:
        return {
            "calls": dict(self.calls),
            "failures": {d: dict(p) for d, p in self.failures.items()},
            "quarantined": dict(self.quarantined),
        }

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.calls = Counter(sd.get("calls", {}))
        self.failures = {d: Counter(p) for d, p in sd.get("failures", {}).items()}
        self.quarantined = dict(sd.get("quarantined", {}))
