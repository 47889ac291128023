"""The judge's client for a judge server (``rewards.judge.engine: sglang``): generation only.

The trainer's ``sglang`` engine (:mod:`megatron_rl.rollout.sglang_client`) owns the policy's
servers: it pushes weights to them at start and after every step, and records versions in a
sync directory. A judge server holds someone else's model, so this client does neither: it has
no weight calls at all and writes nothing. The HTTP is the trainer's
(:class:`~megatron_rl.rollout.sglang_http.SGLangClient`: the Bearer key on every request,
retries of 5xx, 429 and refused connections with back-off, fresh rids per retry).

Start-up probes the URLs in order (``GET /health``, then ``GET /get_model_info`` to try the
key) and keeps the first that answers; none answering raises, which the judge counts ``dead``
and backs off from (:mod:`megatron_rl.rewards.service`). Every request is bounded by the
judge's ``timeout_s``; the batch deadline around it kills this client (:meth:`kill` cancels the
calls in flight and closes the connections).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from collections.abc import Coroutine
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, TypeVar

from megatron_rl.rollout.auth import client_key
from megatron_rl.rollout.sglang_http import RetryableError, SGLangClient

if TYPE_CHECKING:
    from megatron_rl.rollout.base import Completion, GenRequest
    from megatron_rl.rollout.config import RolloutConfig

log = logging.getLogger(__name__)
T = TypeVar("T")


class JudgeClient:
    """Generates on the first judge server of ``cfg.urls`` that answers (see the docstring)."""

    def __init__(self, cfg: RolloutConfig) -> None:
        self.cfg = cfg
        self.calls = 0
        self._inflight: set[Future[Any]] = set()
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._serve, daemon=True, name="judge")
        self._thread.start()
        self.client: SGLangClient | None = None
        try:
            key = client_key(cfg.sglang.api_key_file)  # $MEGATRON_RL_API_KEY, else the file
            self.url = self._run(self._connect(key))
        except BaseException:
            self.shutdown()  # no open session or loop left behind
            raise

    async def _connect(self, key: str | None) -> str:
        errors = []
        for url in self.cfg.urls:
            client = SGLangClient(
                url,
                self.cfg.sglang,
                self.cfg.request_timeout_s,
                api_key=key,
                key_setting="rewards.judge.api_key_file",
            )
            try:
                await self._probe(client)
            except (RetryableError, ValueError) as e:
                await client.close()
                errors.append(str(e))
                continue
            self.client = client
            return client.url
        raise RuntimeError(f"no judge server answers: {'; '.join(errors)}")

    @staticmethod
    async def _probe(client: SGLangClient) -> None:
        status, text = await client._get(f"{client.url}/health")
        if status != 200:
            raise ValueError(f"{client.url}/health answered {status}: {text[:100]}")
        status, _ = await client._get(f"{client.url}/get_model_info")  # needs the key
        if status in (401, 403):
            raise ValueError(client.unauthorized(f"judge server {client.url}", status))

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        fut = asyncio.run_coroutine_threadsafe(coro, self._loop)
        with self._lock:
            self._inflight.add(fut)
        try:
            return fut.result()
        finally:
            with self._lock:
                self._inflight.discard(fut)

    def generate(self, requests: list[GenRequest]) -> list[list[Completion]]:
        """Each request's ``params.n`` completions (greedy requests: the judge's verdicts)."""
        assert self.client is not None
        call_id = f"judge-{uuid.uuid4().hex[:12]}-c{self.calls}"  # unique across restarts
        self.calls += 1
        seeds = [r.params.seed or 0 for r in requests]
        return self._run(self.client.generate(requests, call_id, seeds, None))

    def kill(self) -> None:
        """Abandon the calls in flight (their waiting thread is released) and close, without
        waiting: a batch past its deadline must not wait for the server too."""
        with self._lock:
            inflight = list(self._inflight)
        for fut in inflight:
            fut.cancel()
        self._close()

    def shutdown(self) -> None:
        closing = self._close()
        if closing is None:
            return
        try:
            closing.result(5)
        except Exception as e:  # closing must not stop the run
            log.warning("judge client close: %r", e)
        self._thread.join(timeout=5)

    def _close(self) -> Future[None] | None:
        """Cancel what runs on the loop, close the connections, then stop the loop (None: it
        is stopped already)."""

        async def close() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if self.client is not None:
                await self.client.close()

        def stop(_: Future[None]) -> None:
            try:
                self._loop.call_soon_threadsafe(self._loop.stop)
            except RuntimeError:  # closed already
                pass

        try:
            closing = asyncio.run_coroutine_threadsafe(close(), self._loop)
        except RuntimeError:  # the loop is closed
            return None
        closing.add_done_callback(stop)
        return closing

    def _serve(self) -> None:
        try:
            self._loop.run_forever()
        finally:
            self._loop.close()
