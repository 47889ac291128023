"""The embedded server's ``model_update_lock``: SGLang's reader/writer lock, as SGLang uses it.

SGLang's ``TokenizerManager`` holds one ``RWLock`` (``python/sglang/srt/aio_rwlock.py``):

* every ``/generate`` request holds it as a *reader* for its whole life (``generate_request``);
* every weight update holds it as the *writer* for its whole call: ``update_weights_from_disk``
  for the whole load, ``update_weights_from_distributed`` for one bucket's POST
  (``tokenizer_communicator_mixin.py``), so a sync of many buckets lets readers in between;
* a writer waits for the readers in flight, and readers that arrive while a writer waits queue
  behind it (writer preference), so an update is not starved by a stream of requests;
* ``/health`` and ``/health_generate`` send a one-token generation (``http_server.py``
  ``health_generate``), so they wait behind an update too, and answer 503 when nothing came
  back within ``SGLANG_HEALTH_CHECK_TIMEOUT`` seconds (default 20).

The embedded server does the same, so a router health check that collides with a weight update
behaves here as it does on a GPU cluster.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

HEALTH_TIMEOUT_ENV = "SGLANG_HEALTH_CHECK_TIMEOUT"  # SGLang's own variable, read the same way
DEFAULT_HEALTH_TIMEOUT_S = 20.0  # SGLang's default


def health_timeout_s() -> float:
    """How long a health check waits for its one-token generation (SGLang's variable)."""
    return float(os.environ.get(HEALTH_TIMEOUT_ENV, DEFAULT_HEALTH_TIMEOUT_S))


class RWLock:
    """Many readers or one writer; a waiting writer blocks new readers (writer preference)."""

    def __init__(self) -> None:
        self._cond = asyncio.Condition()
        self.readers = 0  # readers holding the lock
        self.writer = False  # a writer holds the lock
        self.waiting_writers = 0  # writers queued for it

    @asynccontextmanager
    async def reader(self) -> AsyncIterator[None]:
        async with self._cond:
            await self._cond.wait_for(lambda: not self.writer and not self.waiting_writers)
            self.readers += 1
        try:
            yield
        finally:
            async with self._cond:
                self.readers -= 1
                self._cond.notify_all()

    @asynccontextmanager
    async def writer_lock(self) -> AsyncIterator[None]:
        async with self._cond:
            self.waiting_writers += 1
            try:
                await self._cond.wait_for(lambda: not self.writer and not self.readers)
            finally:  # also when cancelled: readers held back by this writer may go
                self.waiting_writers -= 1
                self._cond.notify_all()
            self.writer = True
        try:
            yield
        finally:
            async with self._cond:
                self.writer = False
                self._cond.notify_all()
