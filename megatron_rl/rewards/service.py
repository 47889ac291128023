"""What the model-based rewards share: a backend started and called under a deadline, started
again after it times out or dies, and a count of every sample it could not score.

A scorer (the generative judge, the reward model) asks :meth:`Deadlined.run` for one batched
call. A batch without a backend starts one first, inside the same deadline (``timeout_s``, plus
``start_timeout_s`` for a model that takes long to load). Past the deadline the batch is
abandoned and counted ``timeout`` for each of its samples, the backend is killed (a child
process) or dropped (one whose start-up finishes late is killed then), and the next batch starts
a new one; a backend that raises (an engine error, a dead process, a refused connection) counts
``dead`` the same way.

A start-up that fails (raises or times out) backs off: the next batch does not try again, the
one after a second failure neither does the next two, and so on (1, 2, 4 ... up to
``max_skip`` batches); those batches are counted ``dead`` at once, without blocking the run, and
``<prefix>/start_skipped`` counts them. The first batch that scores ends the back-off. Nothing
here raises into the run: a failed sample is returned as its failure kind, and the caller drops
its group (never a silent 0).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


def stop(backend: Any, kill: bool, prefix: str) -> None:
    """Stop ``backend`` (``kill``: at once, else its ``shutdown``); never raises."""
    try:
        if kill and hasattr(backend, "kill"):
            backend.kill()
        elif hasattr(backend, "shutdown"):
            backend.shutdown()
    except Exception as e:  # a backend that will not stop must not stop the run
        log.warning("%s shutdown: %r", prefix, e)


class _Attempt:
    """One batch's backend: the running one, or one this batch starts inside its deadline."""

    def __init__(self, backend: Any, prefix: str) -> None:
        self.backend, self.prefix = backend, prefix
        self.abandoned = False  # the deadline passed: a backend started now is killed at once
        self._lock = threading.Lock()

    def get(self, make: Callable[[], Any]) -> Any:
        """The backend (started by ``make()`` when there is none yet)."""
        if self.backend is not None:
            return self.backend
        backend = make()
        with self._lock:
            if not self.abandoned:
                self.backend = backend
                return backend
        log.warning("%s started after its deadline: stopped", self.prefix)
        stop(backend, True, self.prefix)
        raise TimeoutError(f"{self.prefix} started after its deadline")

    def abandon(self) -> tuple[Any, bool]:
        """Mark it abandoned; (its backend or None, whether its start-up had finished)."""
        with self._lock:
            self.abandoned = True
            return self.backend, self.backend is not None


class Deadlined:
    """A lazily started backend (``make()``) called one batch at a time under a deadline."""

    kinds: tuple[str, ...] = ("timeout", "dead")  # failure kinds; subclasses add their own
    prefix = "service"  # metrics: <prefix>/failures/<kind>, <prefix>/scored, <prefix>/start_*
    max_skip = 16  # most batches counted dead without a start attempt after a failed start-up

    def __init__(
        self,
        make: Callable[[], Any],
        timeout_s: float,
        domains: list[str] | None = None,
        start_timeout_s: float = 0.0,
    ) -> None:
        self._make, self.timeout_s = make, timeout_s
        self.start_timeout_s = start_timeout_s  # extra seconds for a batch that starts one
        self.domains = list(domains or [])  # names or globs of the domains it scores
        self._backend: Any = None
        self.failures = dict.fromkeys(self.kinds, 0)  # over the run
        self.scored = 0
        self.starts = {"start_failures": 0, "start_skipped": 0}  # start-ups failed, batches
        # counted dead without one (back-off)
        self._failed_starts = 0  # start-ups failed since the last batch that scored
        self._skip = 0  # batches left to count dead before the next start attempt

    def applies(self, domain: str) -> bool:
        """Whether it scores this domain's samples (``domains`` names or globs)."""
        import fnmatch

        return any(fnmatch.fnmatchcase(domain, p) for p in self.domains)

    def run(self, n: int, call: Callable[[Any], list[Any]]) -> list[Any] | str:
        """``call(backend)`` for a batch of ``n`` samples, the backend started first when there
        is none: its results, or the failure kind ('timeout' / 'dead') already counted ``n``
        times. Bounded by ``timeout_s`` (+ ``start_timeout_s`` when it starts the backend)."""
        if self._backend is None and self._skip > 0:  # backing off after a failed start-up
            self._skip -= 1
            self.starts["start_skipped"] += 1
            return self.fail(n, "dead")
        attempt = _Attempt(self._backend, self.prefix)
        budget = self.timeout_s + (self.start_timeout_s if self._backend is None else 0.0)
        try:
            out = self._deadline(lambda: call(attempt.get(self._make)), budget)
        except TimeoutError:
            self._backend, started = attempt.abandon()
            if not started:
                self._start_failed(f"no start-up after {budget} s")
            self.drop(kill=True)
            return self.fail(n, "timeout")
        except Exception as e:  # engine errors, a dead process or server
            if attempt.backend is None:
                self._start_failed(repr(e))
            else:
                log.warning("%s failed on %d samples: %r", self.prefix, n, e)
                self._backend = attempt.backend
                self.drop(kill=True)
            return self.fail(n, "dead")
        self._backend = attempt.backend
        if len(out) != n:
            log.warning("%s returned %d results for %d samples", self.prefix, len(out), n)
            self.drop(kill=True)
            return self.fail(n, "dead")
        self._failed_starts = 0
        return out

    def _start_failed(self, why: str) -> None:
        self.starts["start_failures"] += 1
        self._failed_starts += 1
        self._skip = min(2 ** (self._failed_starts - 1), self.max_skip)
        log.warning(
            "%s could not start (%s): the next %d batch(es) are counted dead without a start",
            self.prefix,
            why,
            self._skip,
        )

    def _deadline(self, fn: Callable[[], list[Any]], timeout_s: float) -> list[Any]:
        box: dict[str, Any] = {}

        def target() -> None:
            try:
                box["out"] = fn()
            except BaseException as e:  # handed to the caller's thread
                box["err"] = e

        th = threading.Thread(target=target, daemon=True, name=self.prefix)
        th.start()
        th.join(timeout_s)
        if th.is_alive():
            raise TimeoutError(f"{self.prefix}: no answer after {timeout_s} s")
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
        if backend is not None:
            stop(backend, kill, self.prefix)

    def metrics(self) -> dict[str, float]:
        out = {f"{self.prefix}/failures/{k}": float(v) for k, v in self.failures.items()}
        out[f"{self.prefix}/scored"] = float(self.scored)
        out |= {f"{self.prefix}/{k}": float(v) for k, v in self.starts.items()}
        return out

    def close(self) -> None:
        self.drop(kill=False)
