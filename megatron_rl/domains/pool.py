"""Verifier worker pool: score many (task, response) pairs in parallel processes, sync or async.

Verifiers can be slow (sympy through ``math-verify``, code run in the sandbox) and some use
``signal.alarm`` timeouts, which only work on a process's main thread. The pool therefore uses
worker *processes* (never threads): each worker builds the domain registry once (plus any JSONL
task files), then runs ``Domain.verify`` on its main thread, so ``math-verify``'s signal-based
timeouts stay active. Work is sent in chunks (``chunk_size`` pairs per message) to amortise
pickling; results come back in input order.

``workers=0`` scores inline in the calling process (the serial path), which the benchmark
compares against.

    pool = VerifierPool(workers=2)
    results = pool.verify([(task, response), ...])            # blocking
    results = await pool.averify([(task, response), ...])     # asyncio-friendly
    pool.close()
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
from collections.abc import Sequence
from concurrent.futures import Future, ProcessPoolExecutor

from megatron_rl.domains.base import Domain, Task, VerifyResult
from megatron_rl.domains.loading import load_domains

Pair = tuple[Task, str]
_WORKER_DOMAINS: dict[str, Domain] = {}


def _init_worker(task_files: Sequence[str]) -> None:
    global _WORKER_DOMAINS
    _WORKER_DOMAINS = load_domains(None, task_files=task_files)


def _verify_chunk(pairs: Sequence[Pair]) -> list[VerifyResult]:
    return [_verify_one(_WORKER_DOMAINS, task, response) for task, response in pairs]


def _verify_one(domains: dict[str, Domain], task: Task, response: str) -> VerifyResult:
    domain = domains.get(task.domain)
    if domain is None:
        return VerifyResult(0.0, False, {"reason": f"unknown domain {task.domain!r}"})
    return domain.verify(task, response)


class VerifierPool:
    """Process pool of verifiers (``workers=0``: inline)."""

    def __init__(
        self,
        workers: int = 0,
        task_files: Sequence[str] = (),
        chunk_size: int = 32,
        start_method: str = "forkserver",
    ) -> None:
        if workers < 0:
            raise ValueError(f"verify workers must be >= 0, got {workers}")
        self.workers = workers
        self.chunk_size = max(1, chunk_size)
        self._inline: dict[str, Domain] | None = None
        self._executor: ProcessPoolExecutor | None = None
        if workers:
            self._executor = ProcessPoolExecutor(
                workers,
                mp_context=mp.get_context(start_method),
                initializer=_init_worker,
                initargs=(list(task_files),),
            )
        else:
            self._inline = load_domains(None, task_files=task_files)

    def _submit(self, pairs: Sequence[Pair]) -> list[Future[list[VerifyResult]]]:
        assert self._executor is not None
        return [
            self._executor.submit(_verify_chunk, list(pairs[i : i + self.chunk_size]))
            for i in range(0, len(pairs), self.chunk_size)
        ]

    def verify(self, pairs: Sequence[Pair]) -> list[VerifyResult]:
        """Verdicts in input order (blocking)."""
        if self._inline is not None:
            return [_verify_one(self._inline, t, r) for t, r in pairs]
        return [res for fut in self._submit(pairs) for res in fut.result()]

    async def averify(self, pairs: Sequence[Pair]) -> list[VerifyResult]:
        """Verdicts in input order, awaiting the workers without blocking the event loop."""
        if self._inline is not None:
            return await asyncio.to_thread(self.verify, pairs)
        chunks = await asyncio.gather(*(asyncio.wrap_future(f) for f in self._submit(pairs)))
        return [res for chunk in chunks for res in chunk]

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None

    def __enter__(self) -> VerifierPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
