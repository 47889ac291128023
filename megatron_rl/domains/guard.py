"""The run's domain calls in one place: workers, deadlines, failure counts and the quarantine.

:class:`DomainGuard` is what the controller and the evals call instead of a domain's methods:
``tasks`` draws training tasks, ``verify`` scores responses, ``fits`` says whether a prompt's
token count leaves room for the response budget. Each failure is counted in the shared
:class:`~megatron_rl.domains.health.DomainHealth` (per domain and kind) and returned as None, so
the caller drops that group (training) or scores that prompt 0 and counts it (evals); calls for a
quarantined domain are skipped without running.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from megatron_rl.domains.base import Task, VerifyResult
from megatron_rl.domains.config import DomainsConfig
from megatron_rl.domains.health import DomainHealth
from megatron_rl.domains.workers import Call, DomainWorkers, Outcome


class DomainGuard:
    """Deadlined, counted domain calls for one run (``limit``: longest prompt, tokens)."""

    def __init__(
        self, workers: DomainWorkers, cfg: DomainsConfig, limit: int | None = None
    ) -> None:
        self.workers, self.cfg, self.limit = workers, cfg, limit
        self.health = DomainHealth(cfg.max_failure_rate, cfg.min_failures)

    def _skip(self, call: Call) -> bool:
        return self.health.is_quarantined(call.domain)

    def _run(self, calls: list[Call], stage: str) -> list[Outcome]:
        def done(c: Call, o: Outcome) -> None:
            bad = _malformed(stage, o.value) if o.ok else ""
            if bad:  # a plugin's override returned garbage: a failure like any other
                o.value, o.failure, o.message = None, "error", bad
            self.health.record(c.domain, stage, o)

        return self.workers.run(calls, skip=self._skip, done=done)

    def tasks(self, wanted: Sequence[tuple[str, int, int]], seed: int) -> list[Task | None]:
        """Training tasks ``(domain, index, level)``; None where the draw failed or was skipped
        (or a plugin's ``task`` returned something that is not a Task)."""
        timeout = self.cfg.task_timeout_s
        calls = [Call("task", d, ("train", i, lv, seed), timeout) for d, i, lv in wanted]
        return [o.value if o.ok else None for o in self._run(calls, "generate")]

    def verify(self, pairs: Sequence[tuple[Task, str]]) -> list[VerifyResult | None]:
        """Verdicts in order; None where verification failed, timed out or was skipped, or
        returned something other than a VerifyResult with a finite score in [0, 1], or one whose
        verifier could not judge (``VerifyResult.error``)."""
        timeout = self.cfg.verify_timeout_s
        calls = [Call("verify", t.domain, (t, r), timeout) for t, r in pairs]
        return [o.value if o.ok else None for o in self._run(calls, "verify")]

    def fits(self, domain: str, prompt_tokens: int) -> bool:
        """Whether a prompt of ``prompt_tokens`` fits; a misfit counts as ``too_long``."""
        if self.limit is None or prompt_tokens <= self.limit:
            return True
        self.health.fail(domain, "too_long", f"{prompt_tokens} prompt tokens > {self.limit}")
        return False

    def close(self) -> None:
        self.workers.close()


def _malformed(stage: str, value: object) -> str:
    """Why a call's value cannot be used (empty: it can)."""
    if stage == "generate":
        ok = isinstance(value, Task) and isinstance(value.prompt, str) and bool(value.prompt)
        return "" if ok else f"task() returned {type(value).__name__}, not a Task with a prompt"
    if not isinstance(value, VerifyResult):
        return f"verify() returned {type(value).__name__}, not a VerifyResult"
    score = value.score
    if not (isinstance(score, int | float) and math.isfinite(score) and 0 <= score <= 1):
        return f"verify() returned score {score!r}, not a number in [0, 1]"
    if value.error:  # the verifier could not judge (e.g. no sandbox for code): no verdict
        return f"verifier could not judge: {value.error}"[:500]
    return ""
