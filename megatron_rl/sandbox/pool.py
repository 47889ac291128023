"""Parallel sandboxed executions, bounded by the machine's cores, with back-pressure.

Each execution is one or two sandboxed processes that the host only waits on, so a thread per
running execution is enough (the work happens in the sandboxes, not under the GIL). At most
``max_workers`` run at once; at most ``max_workers * queue_factor`` more wait in the queue, and
``submit`` blocks while the queue is full, so a producer scoring a huge rollout batch cannot
pile up unbounded work in memory.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace

from megatron_rl.sandbox.result import ExecResult
from megatron_rl.sandbox.runner import Limits, SandboxSettings, run_program


class SandboxPool:
    """Runs ``run_program`` calls concurrently; usable as a context manager."""

    def __init__(
        self,
        max_workers: int | None = None,
        queue_factor: int = 2,
        limits: Limits | None = None,
        allow_unsandboxed: bool = False,
    ) -> None:
        cores = os.cpu_count() or 1
        self.max_workers = max_workers if max_workers and max_workers > 0 else cores
        if queue_factor < 0:
            raise ValueError(f"queue_factor must be >= 0, got {queue_factor}")
        self.limits = limits or Limits()  # per-execution limits (submit may override two)
        self.allow_unsandboxed = allow_unsandboxed
        self._slots = threading.BoundedSemaphore(self.max_workers * (1 + queue_factor))
        self._executor = ThreadPoolExecutor(self.max_workers, thread_name_prefix="sandbox")
        self._closed = False

    @classmethod
    def from_config(cls, cfg: SandboxSettings) -> SandboxPool:
        """A pool sized and limited by the ``rewards.sandbox_*`` config fields."""
        return cls(
            max_workers=cfg.sandbox_workers or None,
            limits=Limits.from_config(cfg),
            allow_unsandboxed=cfg.allow_unsandboxed,
        )

    def submit(
        self,
        program: str,
        tests: str | None = None,
        timeout_s: float | None = None,
        memory_mb: int | None = None,
    ) -> Future[ExecResult]:
        """Queue one execution; blocks while the queue is full (back-pressure). ``timeout_s`` and
        ``memory_mb`` override the pool's limits for this execution."""
        if self._closed:
            raise RuntimeError("SandboxPool.submit after close()")
        limits = replace(
            self.limits,
            timeout_s=self.limits.timeout_s if timeout_s is None else timeout_s,
            memory_mb=self.limits.memory_mb if memory_mb is None else memory_mb,
        )
        self._slots.acquire()
        try:
            future = self._executor.submit(
                run_program,
                program,
                tests,
                allow_unsandboxed=self.allow_unsandboxed,
                limits=limits,
            )
        except BaseException:
            self._slots.release()
            raise
        future.add_done_callback(lambda _: self._slots.release())
        return future

    def map(
        self,
        programs: Sequence[str],
        tests: Iterable[str | None] | None = None,
        timeout_s: float | None = None,
        memory_mb: int | None = None,
    ) -> list[ExecResult]:
        """Run every program (with the matching tests, if given); results in input order."""
        test_list = list(tests) if tests is not None else [None] * len(programs)
        if len(test_list) != len(programs):
            raise ValueError(f"got {len(programs)} programs but {len(test_list)} tests")
        futures = [
            self.submit(p, t, timeout_s, memory_mb)
            for p, t in zip(programs, test_list, strict=True)
        ]
        return [f.result() for f in futures]

    def close(self) -> None:
        """Wait for running executions and stop the workers."""
        self._closed = True
        self._executor.shutdown(wait=True)

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
