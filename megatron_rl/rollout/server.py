"""An embedded server that speaks SGLang's native HTTP API on top of any :class:`RolloutEngine`.

On a GPU cluster the rollout servers are real SGLang; on a laptop or in CI this server stands in
for them, so the exact client (:mod:`megatron_rl.rollout.sglang_client`), sglang-router and the
launchers run end to end without a GPU. Endpoints (schemas in :mod:`.sglang_schema`):

* ``POST /generate``: ``input_ids`` (one prompt or a batch), ``sampling_params`` (one dict or
  one per prompt, ``n`` completions each), ``return_logprob``; the response is one object for a
  single prompt with ``n == 1``, else a list in prompt-major order (prompt 0's ``n`` samples,
  then prompt 1's...), as SGLang returns them.
* ``GET /health`` and ``GET /health_generate``: a one-token generation that waits on the
  ``model_update_lock`` like every request (:mod:`.server_lock`), so a health check during a
  weight update waits for it, as on SGLang; ``GET|POST /flush_cache``, ``POST /abort_request``
  (one rid, or ``abort_all``), ``POST /update_weights_from_disk``,
  ``GET /get_model_info`` and ``/get_server_info`` (plus the ``/model_info`` and
  ``/server_info`` spellings sglang-router 0.3.2 probes when a worker registers);
* SGLang's distributed weight update over gloo (:mod:`.server_weights`):
  ``/init_weights_update_group``, ``/update_weights_from_distributed``,
  ``/destroy_weights_update_group``, ``/get_weights_by_name``.

Design: HTTP handlers validate each request on its own (:mod:`.server_requests`: a bad one is
answered 400 naming the field and never joins a batch), then put it on a queue; one batcher
task drains it into a single ``engine.generate`` call (continuous batching at request
granularity: everything that arrived while the previous batch ran goes into the next one; an
idle engine waits a few ms for the rest of a burst). A batch that still fails inside the engine
is split in halves until only the failing request fails (500, or 400 for a ``ValueError``).
``text`` prompts are tokenised with the served model's tokenizer. The engine runs in a single
worker thread, which also runs weight updates, so an update never races a batch.
``/abort_request`` answers the aborted requests at once with ``finish_reason.type == "abort"``;
a batch already inside the engine finishes there and its result for them is dropped.
``/update_weights_from_disk`` is not implemented by SGLang's ``load_format`` machinery: it calls
the engine's ``update_weights_from_disk`` on a folder of HF ``*.safetensors``.

Sampling seeds as SGLang applies them (``SamplingBatchInfo.from_schedule_batch``): a request's
``sampling_seed`` is honoured only when the server runs with ``--enable-deterministic-inference``
(``deterministic=True``); otherwise every sample follows the server's own seeded stream
(``--random-seed``, the engine seed), so two servers started with the same seed draw the same
samples for the same prompt. ``/get_server_info`` reports both settings under SGLang's names.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from megatron_rl.rollout import sglang_schema
from megatron_rl.rollout.base import Completion, GenRequest, RolloutEngine, SamplingParams
from megatron_rl.rollout.server_lock import RWLock, health_timeout_s
from megatron_rl.rollout.server_requests import (
    Limits,
    ParsedGenerate,
    aborted,
    completion_to_sglang,
    error_response,
    parse_generate,
    stream_response,
)
from megatron_rl.rollout.server_requests import to_gen_request as to_gen_request  # re-export
from megatron_rl.rollout.server_weights import WeightReceiver

log = logging.getLogger(__name__)

BATCH_GAP_S = 0.005  # an idle engine waits this long for one more request of a burst ...
BATCH_WINDOW_S = 0.05  # ... and at most this long in all (see EmbeddedServer._collect)
MAX_BODY_BYTES = 32 * 1024**2  # larger bodies get 413; a 512k-token prompt is ~4 MiB of JSON


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


class EmbeddedServer:
    """SGLang-native HTTP front for one engine. ``app()`` gives the aiohttp application."""

    def __init__(
        self,
        engine: RolloutEngine,
        model_path: str,
        max_batch: int = 256,
        deterministic: bool = False,
        bucket_timeout_s: float = 60.0,
    ) -> None:
        self.engine = engine
        self.model_path = model_path
        self.max_batch = max_batch  # most sequences (prompts x n) per engine call
        self.deterministic = deterministic  # honour sampling_seed (SGLang's deterministic mode)
        self.lock = RWLock()  # SGLang's model_update_lock: requests read, weight updates write
        self.weight_version = "default"
        self.queue: asyncio.Queue[_Pending] = asyncio.Queue()
        self.inflight: dict[str, list[_Pending]] = {}
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine")
        self.stats = {"requests": 0, "batches": 0, "aborted": 0, "weight_updates": 0}
        self.stats |= {"batch_splits": 0, "failed": 0, "abort_requests": 0, "health_checks": 0}
        self.limits = Limits(
            engine.vocab_size or None, engine.context_len, max_batch, engine.routed_experts
        )
        self._tokenizer: Any = None
        self._batcher: asyncio.Task[None] | None = None
        self.receiver = WeightReceiver(self, bucket_timeout_s)  # /init_weights_update_group...

    # ---- batching -------------------------------------------------------------------------
    async def _run_batches(self) -> None:
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

    async def _submit(self, rid: str, req: GenRequest) -> list[Completion]:
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

    # ---- handlers -------------------------------------------------------------------------
    async def generate(self, request: web.Request) -> web.StreamResponse:
        try:
            parsed = await self._parse_generate(request)
            self.check_new_rids(parsed.rids)
        except ValueError as e:
            return error_response(400, str(e))
        self.stats["requests"] += 1
        if not self.deterministic:  # SGLang ignores sampling_seed outside deterministic mode
            for q in parsed.requests:
                q.params.seed = None
        async with self.lock.reader():  # held for the request's life, as SGLang holds it
            subs = [self._submit(r, q) for r, q in zip(parsed.rids, parsed.requests, strict=True)]
            results = await asyncio.gather(*subs, return_exceptions=True)
        for res in results:
            if isinstance(res, EngineFailure):
                return error_response(res.status, str(res))
            if isinstance(res, BaseException):
                raise res
        outs = []
        for rid, req, comps in zip(parsed.rids, parsed.requests, results, strict=True):
            for j, c in enumerate(comps):  # type: ignore[arg-type]
                sub = rid if req.params.n == 1 else f"{rid}-{j}"
                outs.append(
                    completion_to_sglang(
                        c,
                        sub,
                        prompt_len=len(req.prompt_ids),
                        return_logprob=parsed.return_logprob,
                        weight_version=self.weight_version,
                        return_routed_experts=parsed.return_routed_experts,
                    )
                )
        if parsed.stream:
            return await stream_response(request, outs)
        return web.json_response(outs[0] if parsed.single and len(outs) == 1 else outs)

    async def _parse_generate(self, request: web.Request) -> ParsedGenerate:
        """The validated body; ``ValueError`` (-> 400) names the bad field."""
        try:
            body = json.loads(await request.read())
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
            raise ValueError(f"the /generate body is not valid JSON: {e!r}") from None
        if isinstance(body, dict) and body.get("text") is not None:
            # tokenising a long text takes a while: off the event loop (not the engine thread)
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(
                None, parse_generate, body, self.limits, self._tokenize
            )
        return parse_generate(body, self.limits, None)

    def _tokenize(self, text: str) -> list[int]:
        """``text`` -> token ids with the served model's tokenizer (loaded on first use)."""
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            try:
                self._tokenizer = AutoTokenizer.from_pretrained(self.model_path)
            except (OSError, ValueError) as e:
                raise ValueError(f"'text' needs the model's tokenizer, which failed: {e}") from e
        return list(self._tokenizer.encode(text))

    async def abort_request(self, request: web.Request) -> web.Response:
        body = await request.json() if request.can_read_body else {}
        sglang_schema.validate("abort_request", body)
        self.stats["abort_requests"] += 1
        self.abort(None if body.get("abort_all") else body.get("rid") or "")
        return web.json_response({"success": True})

    def abort(self, rid: str | None) -> None:
        """Answer ``rid`` (every request in flight when None: ``abort_all``) as aborted."""
        for r in list(self.inflight) if rid is None else [rid]:
            for p in list(self.inflight.get(r, [])):
                if not p.future.done():
                    p.future.set_result(aborted(p.request.params.n))
                    self.stats["aborted"] += 1

    async def update_weights_from_disk(self, request: web.Request) -> web.Response:
        body = await request.json()
        try:
            sglang_schema.validate("update_weights_from_disk", body)
        except ValueError as e:
            return web.json_response({"success": False, "message": str(e)}, status=400)
        loop = asyncio.get_running_loop()
        path = body["model_path"]
        if body.get("abort_all_requests"):
            self.abort(None)
        try:
            async with self.lock.writer_lock():  # for the whole load, as SGLang holds it
                secs = await loop.run_in_executor(
                    self.executor, self.engine.update_weights_from_disk, path
                )
        except Exception as e:
            log.exception("update_weights_from_disk(%s) failed", path)
            msg = f"update_weights_from_disk({path}) failed: {e}"
            return web.json_response({"success": False, "message": msg}, status=400)
        self.weight_version = body.get("weight_version") or self.weight_version
        self.stats["weight_updates"] += 1
        self.receiver.loaded_from_disk(path)
        msg = f"loaded {path} as weight_version={self.weight_version} in {secs:.3f} s"
        return web.json_response({"success": True, "message": msg, "num_paused_requests": 0})

    async def health(self, request: web.Request) -> web.Response:
        """``/health`` = ``/health_generate`` (SGLang's ``health_generate``): one token, behind
        the update lock; 503 when nothing came back within ``SGLANG_HEALTH_CHECK_TIMEOUT`` s."""
        req = GenRequest(prompt_ids=[0], params=SamplingParams(max_tokens=1, temperature=0.0))
        self.stats["health_checks"] += 1

        async def one_token() -> None:
            async with self.lock.reader():
                await self._submit(f"HEALTH_CHECK_{uuid.uuid4().hex}", req)

        try:
            await asyncio.wait_for(one_token(), health_timeout_s())
        except Exception as e:
            return web.Response(status=503, text=f"health check failed: {e!r}")
        return web.Response(text="OK")

    async def flush_cache(self, request: web.Request) -> web.Response:
        # Engines reset their prefix caches after every weight update (base.py contract).
        return web.Response(text="Cache flushed.")

    async def model_info(self, request: web.Request) -> web.Response:
        info: dict[str, Any] = {"model_path": self.model_path, "tokenizer_path": self.model_path}
        info |= {"is_generation": True, "weight_version": self.weight_version}
        return web.json_response(info)

    async def server_info(self, request: web.Request) -> web.Response:
        info: dict[str, Any] = {"model_path": self.model_path, "engine": type(self.engine).__name__}
        info |= {"pid": os.getpid(), "weight_version": self.weight_version, "stats": self.stats}
        info |= {"random_seed": getattr(self.engine, "seed", None)}  # SGLang's server_args names
        info |= {"enable_deterministic_inference": self.deterministic}
        return web.json_response(info)

    # ---- application ----------------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        r = app.router
        r.add_post("/generate", self.generate)
        r.add_get("/health", self.health)
        r.add_get("/health_generate", self.health)
        r.add_route("*", "/flush_cache", self.flush_cache)
        r.add_post("/abort_request", self.abort_request)
        r.add_post("/update_weights_from_disk", self.update_weights_from_disk)
        self.receiver.add_routes(r)
        for path in ("/get_model_info", "/model_info"):
            r.add_get(path, self.model_info)
        for path in ("/get_server_info", "/server_info"):
            r.add_get(path, self.server_info)
        app.on_startup.append(self._start)
        app.on_cleanup.append(self._stop)
        return app

    async def _start(self, app: web.Application) -> None:
        self._batcher = asyncio.create_task(self._run_batches())

    async def _stop(self, app: web.Application) -> None:
        if self._batcher is not None:
            self._batcher.cancel()
        self.executor.shutdown(wait=True, cancel_futures=True)
        self.engine.shutdown()


def serve(engine: RolloutEngine, model_path: str, host: str, port: int, **kw: Any) -> None:
    """Serve until SIGINT/SIGTERM; the engine is shut down on the way out. ``kw``: the
    :class:`EmbeddedServer` settings (max_batch, deterministic, bucket_timeout_s)."""
    server = EmbeddedServer(engine, model_path, **kw)
    t0 = time.monotonic()
    log.info("embedded SGLang-compatible server on http://%s:%d (model %s)", host, port, model_path)
    # shutdown_timeout: the router holds keep-alive connections; do not wait for them on exit.
    web.run_app(
        server.app(), host=host, port=port, print=None, handle_signals=True, shutdown_timeout=2
    )
    log.info("server on port %d stopped after %.1f s", port, time.monotonic() - t0)
