"""What the model-based rewards share: a backend called under a deadline, started again after
it times out or dies, and a count of every sample it could not score.

A scorer (the generative judge, the reward model) asks :meth:`Deadlined.run` for one batched
call. Past ``timeout_s`` the call is abandoned and counted ``timeout`` for each of its samples,
the backend is killed (a child process) or dropped, and the next batch starts a new one; a
backend that raises (an engine error, a dead process, a refused connection) counts ``dead`` the
same way. Nothing here raises into the run: a failed sample is returned as its failure kind, and
the caller drops its group (never a silent 0).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


class Deadlined:
    """A lazily started backend (``make()``) called one batch at a time under a deadline."""

    kinds: tuple[str, ...] = ("timeout", "dead")  # failure kinds; subclasses add their own
    prefix = "service"  # metrics: <prefix>/failures/<kind>, <prefix>/scored

    def __init__(
        self, make: Callable[[], Any], timeout_s: float, domains: list[str] | None = None
    ) -> None:
        self._make, self.timeout_s = make, timeout_s
        self.domains = list(domains or [])  # names or globs of the domains it scores
        self._backend: Any = None
        self.failures = dict.fromkeys(self.kinds, 0)  # over the run
        self.scored = 0

    def applies(self, domain: str) -> bool:
        """Whether it scores this domain's samples (``domains`` names or globs)."""
        import fnmatch

        return any(fnmatch.fnmatchcase(domain, p) for p in self.domains)

    def run(self, n: int, call: Callable[[Any], list[Any]]) -> list[Any] | str:
        """``call(backend)`` for a batch of ``n`` samples: its results, or the failure kind
        ('timeout' / 'dead') already counted ``n`` times."""
        try:
            if self._backend is None:
                self._backend = self._make()
            out = self._deadline(lambda: call(self._backend))
        except TimeoutError:
            self.drop(kill=True)
            return self.fail(n, "timeout")
        except Exception as e:  # noqa: BLE001 - engine errors, a dead process or server
            log.warning("%s failed on %d samples: %r", self.prefix, n, e)
            self.drop(kill=True)
            return self.fail(n, "dead")
        if len(out) != n:
            log.warning("%s returned %d results for %d samples", self.prefix, len(out), n)
            self.drop(kill=True)
            return self.fail(n, "dead")
        return out

    def _deadline(self, fn: Callable[[], list[Any]]) -> list[Any]:
        box: dict[str, Any] = {}

        def target() -> None:
            try:
                box["out"] = fn()
            except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
                box["err"] = e

        th = threading.Thread(target=target, daemon=True, name=self.prefix)
        th.start()
        th.join(self.timeout_s)
        if th.is_alive():
            raise TimeoutError(f"{self.prefix}: no answer after {self.timeout_s} s")
        if "err" in box:
            raise box["err"]
        out: list[Any] = box["out"]
        return out

    def fail(self, n: int, kind: str) -> str:
        self.failures[kind] += n
        return kind

    def count(self, results: list[Any]) -> None:
        """Count a batch's per-sample results: a str is a failure kind, anything else scored."""
        for r in results:
            if isinstance(r, str):
                self.failures[r] += 1
            else:
                self.scored += 1

    def drop(self, kill: bool) -> None:
        """Stop the backend (``kill``: at once); the next batch starts a new one."""
        backend, self._backend = self._backend, None
        if backend is None:
            return
        try:
            if kill and hasattr(backend, "kill"):
                backend.kill()
            elif hasattr(backend, "shutdown"):
                backend.shutdown()
        except Exception as e:  # noqa: BLE001 - a backend that will not stop must not stop the run
            log.warning("%s shutdown: %r", self.prefix, e)

    def metrics(self) -> dict[str, float]:
        out = {f"{self.prefix}/failures/{k}": float(v) for k, v in self.failures.items()}
        out[f"{self.prefix}/scored"] = float(self.scored)
        return out

    def close(self) -> None:
        self.drop(kill=False)
