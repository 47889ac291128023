"""Domain code under a deadline: task draws and verifications in worker processes.

A run across hundreds of domains runs hundreds of plugins' code, and one of them can stall (a
generator that searches forever), raise, or hang in its verifier. Python cannot stop a thread,
so every call into a domain that might not return goes to a worker *process* that the
controller can kill:

- ``DomainWorkers(n)`` starts ``n`` processes; each builds the domain registry once (plus the
  run's JSONL task files) and then serves calls on its main thread, so verifiers' own
  ``signal.alarm`` timeouts stay active;
- :meth:`DomainWorkers.run` sends a list of :class:`Call` (``task``: ``Domain.task(split, index,
  level, seed)``; ``verify``: ``Domain.verify(task, response)``; ``draw``: a distinct-prompt set,
  :func:`megatron_rl.domains.draws.draw_distinct`), a few per message, and returns one
  :class:`Outcome` per call in input order: the value, or a failure (``timeout``, ``error``,
  ``died``, ``skipped``) with its message. It never raises for a domain's fault;
- a call past its deadline gets its worker killed (SIGKILL) and replaced; the calls queued
  behind it on that worker are sent again. A worker that dies (a plugin calling ``os._exit``, a
  segfault) is replaced the same way;
- ``skip(call)`` is asked before each call is sent: the controller's quarantine
  (:mod:`megatron_rl.domains.health`) uses it so a hanging domain costs a few timeouts, not one
  per sample.

``n = 0`` runs the calls inline (the serial path used by tests and small tools): exceptions are
still caught, but deadlines cannot be enforced there, which the log says once.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import signal
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

from megatron_rl.domains.base import Domain

log = logging.getLogger(__name__)
CHUNK = 8  # calls per message to a worker
FAILURES = ("timeout", "error", "died", "skipped")


@dataclass(frozen=True)
class Call:
    """One call into a domain: ``kind`` is 'task', 'verify' or 'draw'; ``args`` its arguments
    after the domain name; ``timeout_s`` its deadline once a worker starts it."""

    kind: str
    domain: str
    args: tuple[Any, ...]
    timeout_s: float


@dataclass
class Outcome:
    """A call's value, or ``failure`` (one of FAILURES) with ``message``."""

    value: Any = None
    failure: str = ""
    message: str = ""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.failure


def call_domain(domains: dict[str, Domain], call: Call) -> Any:
    """Run one call against ``domains`` (in a worker, or inline)."""
    d = domains.get(call.domain)
    if d is None:
        raise KeyError(f"unknown domain {call.domain!r} in this process's registry")
    if call.kind == "task":
        return d.task(*call.args)
    if call.kind == "verify":
        return d.verify(*call.args)
    if call.kind == "draw":
        return _draw_before_deadline(d, call)
    raise ValueError(f"call kind must be 'task', 'verify' or 'draw', got {call.kind!r}")


def _draw_before_deadline(d: Domain, call: Call) -> Any:
    """A prompt set, interrupted (keeping what it drew) shortly before the call's deadline
    where this is a main thread with timers, so a slow last draw does not lose the set."""
    from megatron_rl.domains.alarm import interrupt_after
    from megatron_rl.domains.draws import DrawInterrupted, draw_distinct

    with interrupt_after(max(0.1, call.timeout_s - min(2.0, call.timeout_s / 4)), DrawInterrupted):
        return draw_distinct(d, *call.args)


def _serve(
    conn: Connection, task_files: list[str], setup: Callable[[], None] | None = None
) -> None:
    """A worker's loop: run ``setup``, build the registry, then answer (index, Call) lists one
    call at a time.

    The preemption signals are the trainer's: a worker ignores SIGUSR1 and SIGINT (Slurm and
    torchrun may deliver them to every process of the job) and leaves its parent's process
    group; it ends when its parent closes the pipe (or exits), or on SIGTERM / SIGKILL.
    """
    import os

    from megatron_rl.domains.loading import load_domains

    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        os.setsid()
    except OSError:
        pass
    if setup is not None:
        setup()
    domains = load_domains(None, task_files=task_files)
    conn.send(("ready", None, None))
    while True:
        try:
            batch = conn.recv()
        except EOFError:
            return
        if batch is None:
            return
        for i, call in batch:
            t0 = time.perf_counter()
            try:
                msg: tuple[Any, ...] = (i, "", call_domain(domains, call))
            except Exception as e:  # a plugin's fault is an outcome, not a crash
                tb = traceback.format_exception_only(type(e), e)[-1].strip()
                msg = (i, "error", tb[:500])
            try:
                conn.send((*msg, time.perf_counter() - t0))
            except Exception as e:  # an unpicklable value
                conn.send((i, "error", f"result could not be sent: {e!r}"[:500], 0.0))


@dataclass
class _Worker:
    proc: Any
    conn: Connection
    queue: deque[tuple[int, Call]] = field(default_factory=deque)  # sent, not yet answered
    since: float = 0.0  # when the call at the head of ``queue`` started


class DomainWorkers:
    """``n`` killable worker processes for domain code (``n = 0``: inline, no deadlines).

    ``setup``: a picklable callable each worker runs before it builds the registry (inline: run
    here), e.g. the run's settings of its verifiers (``code_exec.configure``).
    """

    def __init__(
        self,
        n: int,
        task_files: Sequence[str] = (),
        start_method: str = "spawn",
        setup: Callable[[], None] | None = None,
    ) -> None:
        if n < 0:
            raise ValueError(f"domain workers must be >= 0, got {n}")
        self.n, self.task_files, self.setup = n, list(task_files), setup
        self._ctx: Any = mp.get_context(start_method)
        self._workers: list[_Worker] = []
        self._inline: dict[str, Domain] | None = None
        self.restarts = 0  # workers killed or found dead and replaced
        self._lock = threading.Lock()  # one run() at a time (the off-policy thread, evals)
        if n == 0:
            from megatron_rl.domains.loading import load_domains

            if setup is not None:
                setup()
            self._inline = load_domains(None, task_files=task_files)
            log.info("domain calls run inline: errors are caught, deadlines are not enforced")
        else:
            starting = [self._spawn() for _ in range(n)]
            self._workers = [self._ready(w) for w in starting]

    def _spawn(self) -> _Worker:
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(
            target=_serve,
            args=(child, self.task_files, self.setup),
            daemon=True,
            name="domain-worker",
        )
        proc.start()
        child.close()
        return _Worker(proc, parent)

    def _ready(self, w: _Worker) -> _Worker:
        if not w.conn.poll(300):
            raise RuntimeError("a domain worker did not start within 300 s")
        try:
            w.conn.recv()
        except EOFError:
            raise RuntimeError(
                f"a domain worker died while loading the registry (exit {w.proc.exitcode})"
            ) from None
        return w

    def _replace(self, w: _Worker) -> _Worker:
        """Kill ``w`` and start a fresh worker in its place (its queued calls go back)."""
        self.restarts += 1
        w.proc.kill()
        w.proc.join(5)
        w.conn.close()
        fresh = self._ready(self._spawn())
        self._workers[self._workers.index(w)] = fresh
        return fresh

    def run(
        self,
        calls: Sequence[Call],
        skip: Callable[[Call], bool] | None = None,
        done: Callable[[Call, Outcome], None] | None = None,
        chunk: int = CHUNK,
    ) -> list[Outcome]:
        """One outcome per call, in order. ``skip(call)`` is asked before a call is sent (true:
        the call fails as 'skipped'); ``done(call, outcome)`` is told each outcome as it comes.
        ``chunk``: calls per message (1 for long calls, so no worker idles while another holds
        a queue of them)."""
        with self._lock:
            return self._run(calls, skip, done, max(1, chunk))

    def _run(
        self,
        calls: Sequence[Call],
        skip: Callable[[Call], bool] | None,
        done: Callable[[Call, Outcome], None] | None,
        chunk: int,
    ) -> list[Outcome]:
        out: list[Outcome | None] = [None] * len(calls)

        def finish(i: int, o: Outcome) -> None:
            out[i] = o
            if done is not None:
                done(calls[i], o)

        if self._inline is not None:
            for i, c in enumerate(calls):
                finish(i, self._inline_call(c, skip))
            return [o for o in out if o is not None]
        todo = deque(enumerate(calls))
        while todo or any(w.queue for w in self._workers):
            for w in self._workers:  # top up idle workers
                if w.queue or not todo:
                    continue
                batch: list[tuple[int, Call]] = []
                while todo and len(batch) < chunk:
                    i, c = todo.popleft()
                    if skip is not None and skip(c):
                        finish(i, Outcome(failure="skipped", message=f"{c.domain} quarantined"))
                        continue
                    batch.append((i, c))
                if batch:
                    try:
                        w.conn.send(batch)
                    except OSError:  # the worker died between calls (a signal): not a domain's
                        todo.extendleft(reversed(batch))  # fault; the calls go to a fresh one
                        self._replace(w)
                        continue
                    w.queue.extend(batch)
                    w.since = time.monotonic()
            busy = [w for w in self._workers if w.queue]
            if not busy:
                continue
            now = time.monotonic()
            left = min(w.since + w.queue[0][1].timeout_s - now for w in busy)
            ready = wait([w.conn for w in busy], timeout=max(0.0, left))
            for w in busy:
                if w.conn in ready:
                    try:
                        i, failure, value, secs = w.conn.recv()
                    except (EOFError, OSError):
                        i, c = w.queue.popleft()
                        finish(i, Outcome(failure="died", message=_died(w, c)))
                        todo.extendleft(reversed(w.queue))
                        w.queue.clear()
                        self._replace(w)
                        continue
                    w.queue.popleft()
                    w.since = time.monotonic()
                    if failure:
                        finish(i, Outcome(failure=failure, message=value, seconds=secs))
                    else:
                        finish(i, Outcome(value=value, seconds=secs))
                elif time.monotonic() - w.since >= w.queue[0][1].timeout_s:
                    i, c = w.queue.popleft()
                    msg = f"{c.kind} of {c.domain} passed its {c.timeout_s:g} s deadline"
                    finish(i, Outcome(failure="timeout", message=msg, seconds=c.timeout_s))
                    todo.extendleft(reversed(w.queue))
                    w.queue.clear()
                    self._replace(w)
        return [o for o in out if o is not None]

    def _inline_call(self, c: Call, skip: Callable[[Call], bool] | None) -> Outcome:
        if skip is not None and skip(c):
            return Outcome(failure="skipped", message=f"{c.domain} quarantined")
        assert self._inline is not None
        t0 = time.perf_counter()
        try:
            return Outcome(value=call_domain(self._inline, c), seconds=time.perf_counter() - t0)
        except Exception as e:  # a plugin's fault is an outcome
            msg = traceback.format_exception_only(type(e), e)[-1].strip()[:500]
            return Outcome(failure="error", message=msg, seconds=time.perf_counter() - t0)

    def close(self) -> None:
        for w in self._workers:
            try:
                w.conn.send(None)
            except (OSError, BrokenPipeError):
                pass
        for w in self._workers:
            w.proc.join(2)
            if w.proc.is_alive():
                w.proc.kill()
                w.proc.join(2)
            w.conn.close()
        self._workers = []

    def __enter__(self) -> DomainWorkers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _died(w: _Worker, c: Call) -> str:
    w.proc.join(1)
    return f"the worker died in {c.kind} of {c.domain} (exit code {w.proc.exitcode})"
