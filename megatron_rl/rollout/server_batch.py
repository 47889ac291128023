"""The embedded server's batcher: requests queued by the HTTP handlers (:mod:`.server`) are
drained into single ``engine.generate`` calls on the engine's one worker thread.

Continuous batching at request granularity: everything that arrived while the previous batch ran
goes into the next one, and an idle engine waits a few ms for the rest of a burst. A batch that
fails inside the engine is split in halves until only the failing request fails. ``abort``
answers requests at once with ``finish_reason.type == "abort"``; a batch already inside the
engine finishes there and its result for them is dropped.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from megatron_rl.rollout.base import Completion, GenRequest, RolloutEngine
from megatron_rl.rollout.server_requests import aborted

log = logging.getLogger(__name__)

BATCH_GAP_S = 0.005  # an idle engine waits this long for one more request of a burst ...
BATCH_WINDOW_S = 0.05  # ... and at most this long in all (see Batcher._collect)


class EngineFailure(RuntimeError):
    """``engine.generate`` failed on one request run alone: answered 500 (400 if ValueError)."""

    def __init__(self, cause: Exception) -> None:
        super().__init__(f"engine.generate failed on this request: {type(cause).__name__}: {cause}")
        self.status = 400 if isinstance(cause, ValueError) else 500


@dataclass
class _Pending:
    """One prompt of a /generate call waiting for its ``n`` completions."""

    rid: str
    request: GenRequest
    future: asyncio.Future[list[Completion]] = field(repr=False)


class Batcher:
    """The queue, the requests in flight and the engine's thread of one embedded server."""

    def __init__(self, engine: RolloutEngine, max_batch: int, stats: dict[str, int]) -> None:
        self.engine = engine
        self.max_batch = max_batch  # most sequences (prompts x n) per engine call
        self.stats = stats  # the server's counters (batches, failed, batch_splits, aborted)
        self.queue: asyncio.Queue[_Pending] = asyncio.Queue()
        self.inflight: dict[str, list[_Pending]] = {}
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine")

    async def run(self) -> None:
        """Forever: the next batch into the engine."""
        while True:
            batch = [p for p in await self._collect() if not p.future.done()]  # not aborted
            if batch:
                self.stats["batches"] += 1
                await self._generate_batch(batch)

    async def _collect(self) -> list[_Pending]:
        """The next batch: what is queued, plus what keeps arriving (gaps < ``BATCH_GAP_S``,
        for at most ``BATCH_WINDOW_S``) while the engine is idle, up to ``max_batch`` rows.

        The engine batches whole requests, so the first request of a burst (a trainer step
        sends one request per sample) must not leave alone while the rest are in flight.
        """
        loop = asyncio.get_running_loop()
        batch = [await self.queue.get()]
        seqs = batch[0].request.params.n
        deadline = loop.time() + BATCH_WINDOW_S
        while seqs < self.max_batch:
            if self.queue.empty():
                wait = min(BATCH_GAP_S, deadline - loop.time())
                if wait <= 0:
                    break
                try:
                    batch.append(await asyncio.wait_for(self.queue.get(), wait))
                except TimeoutError:
                    break
            else:
                batch.append(self.queue.get_nowait())
            seqs += batch[-1].request.params.n
        return batch

    async def _generate_batch(self, batch: list[_Pending]) -> None:
        """Run one engine call; if it fails, bisect so that only the failing request(s) fail.

        Requests are validated before they are queued, so a failure here is unexpected; halving
        keeps the innocent ones batched and finds one culprit in ~log2(len(batch)) extra calls.
        """
        loop = asyncio.get_running_loop()
        reqs = [p.request for p in batch]
        try:
            outs = await loop.run_in_executor(self.executor, self.engine.generate, reqs)
        except Exception as e:  # reported to the culprit only, the server keeps serving
            if len(batch) == 1:
                log.warning("engine.generate failed on request %s: %r", batch[0].rid, e)
                self.stats["failed"] += 1
                if not batch[0].future.done():
                    batch[0].future.set_exception(EngineFailure(e))
                return
            log.warning("engine.generate failed on a batch of %d; splitting it: %r", len(batch), e)
            self.stats["batch_splits"] += 1
            half = len(batch) // 2
            for part in (batch[:half], batch[half:]):
                live = [p for p in part if not p.future.done()]
                if live:
                    await self._generate_batch(live)
            return
        for p, out in zip(batch, outs, strict=True):
            if not p.future.done():
                p.future.set_result(out)

    async def submit(self, rid: str, req: GenRequest) -> list[Completion]:
        fut: asyncio.Future[list[Completion]] = asyncio.get_running_loop().create_future()
        pending = _Pending(rid, req, fut)
        self.inflight.setdefault(rid, []).append(pending)
        await self.queue.put(pending)
        try:
            return await fut
        finally:
            group = self.inflight.get(rid, [])
            if pending in group:
                group.remove(pending)
            if not group:
                self.inflight.pop(rid, None)

    def check_new_rids(self, rids: list[str]) -> None:
        """SGLang's TokenizerManager rejects a rid already in flight ("Duplicate request ID
        detected", HTTP 400) and a batch repeating a rid; so does this server."""
        dup = [r for r in rids if r in self.inflight] or [r for r in rids if rids.count(r) > 1]
        if dup:
            raise ValueError(f"Duplicate request ID detected: {dup[0]}")

    def abort(self, rid: str | None) -> None:
        """Answer ``rid`` (every request in flight when None: ``abort_all``) as aborted."""
        for r in list(self.inflight) if rid is None else [rid]:
            for p in list(self.inflight.get(r, [])):
                if not p.future.done():
                    p.future.set_result(aborted(p.request.params.n))
                    self.stats["aborted"] += 1
