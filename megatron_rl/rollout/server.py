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

Who may call it, and how much (:mod:`.server_guard`): every request but ``GET /health`` carries
the fleet's API key (401 without it); a weight-update group may only be led by the configured
trainer; a request's prompts and tokens and the queue of waiting samples are bounded (400 for a
request that can never fit, 429 with ``Retry-After`` for one that does not fit now).

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
from typing import Any

from aiohttp import web

from megatron_rl.rollout import sglang_schema
from megatron_rl.rollout.base import GenRequest, RolloutEngine, SamplingParams
from megatron_rl.rollout.server_batch import Batcher, EngineFailure, _Pending
from megatron_rl.rollout.server_guard import QueueBound, TrainerCheck, auth_middleware, busy
from megatron_rl.rollout.server_lock import RWLock, health_timeout_s
from megatron_rl.rollout.server_requests import (
    Limits,
    ParsedGenerate,
    completion_to_sglang,
    error_response,
    parse_generate,
    stream_response,
)
from megatron_rl.rollout.server_requests import to_gen_request as to_gen_request  # re-export
from megatron_rl.rollout.server_weights import WeightReceiver

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 32 * 1024**2  # larger bodies get 413; a 512k-token prompt is ~4 MiB of JSON
PARSE_OFF_LOOP_BYTES = 64 * 1024  # larger /generate bodies are parsed on a thread, not the loop


class EmbeddedServer:
    """SGLang-native HTTP front for one engine. ``app()`` gives the aiohttp application.

    ``api_key``: the Bearer token every request but ``GET /health`` must carry (None: no check,
    for a server embedded in a test's own process; ``megatron-rl serve`` always sets one).
    ``trainer``: the only ``master_address`` a weight-update group may name (:mod:`.server_guard`).
    """

    def __init__(
        self,
        engine: RolloutEngine,
        model_path: str,
        *,
        api_key: str | None,
        max_batch: int = 256,
        deterministic: bool = False,
        bucket_timeout_s: float = 60.0,
        trainer: str = "",
        max_prompts: int = 1024,
        max_tokens: int = 1 << 22,
        max_queued: int = 0,
    ) -> None:
        self.engine = engine
        self.model_path = model_path
        self.deterministic = deterministic  # honour sampling_seed (SGLang's deterministic mode)
        self.lock = RWLock()  # SGLang's model_update_lock: requests read, weight updates write
        self.weight_version = "default"
        self.stats = {"requests": 0, "batches": 0, "aborted": 0, "weight_updates": 0}
        self.stats |= {"batch_splits": 0, "failed": 0, "abort_requests": 0, "health_checks": 0}
        self.stats["busy"] = 0  # requests answered 429 (the queue was full)
        self.limits = Limits(
            engine.vocab_size or None,
            engine.context_len,
            max_batch,
            engine.routed_experts,
            max_prompts,
            max_tokens,
        )
        self.api_key = api_key
        self.trainer = TrainerCheck(trainer)  # who may lead a weight-update group
        self.queued = QueueBound(max_queued or 16 * max_batch)  # samples waiting or running
        self._tokenizer: Any = None
        self.batcher = Batcher(engine, max_batch, self.stats)
        self._batcher: asyncio.Task[None] | None = None
        self.receiver = WeightReceiver(self, bucket_timeout_s)  # /init_weights_update_group...

    # ---- handlers -------------------------------------------------------------------------
    async def generate(self, request: web.Request) -> web.StreamResponse:
        try:
            parsed = await self._parse_generate(request)
            self.batcher.check_new_rids(parsed.rids)
        except ValueError as e:
            return error_response(400, str(e))
        samples = sum(q.params.n for q in parsed.requests)
        if not self.queued.take(samples):
            self.stats["busy"] += 1
            return busy(self.queued, samples)
        try:
            return await self._generate(request, parsed)
        finally:
            self.queued.give(samples)

    async def _generate(self, request: web.Request, parsed: ParsedGenerate) -> web.StreamResponse:
        self.stats["requests"] += 1
        if not self.deterministic:  # SGLang ignores sampling_seed outside deterministic mode
            for q in parsed.requests:
                q.params.seed = None
        async with self.lock.reader():  # held for the request's life, as SGLang holds it
            pairs = zip(parsed.rids, parsed.requests, strict=True)
            subs = [self.batcher.submit(r, q) for r, q in pairs]
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
        raw = await request.read()
        if len(raw) <= PARSE_OFF_LOOP_BYTES and b'"text"' not in raw:
            return self._parse_body(raw)
        # a large body takes a while to decode and check, and tokenising a text longer still:
        # off the event loop (not the engine's thread), so other requests are answered meanwhile
        return await asyncio.get_running_loop().run_in_executor(None, self._parse_body, raw)

    def _parse_body(self, raw: bytes) -> ParsedGenerate:
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
            raise ValueError(f"the /generate body is not valid JSON: {e!r}") from None
        return parse_generate(body, self.limits, self._tokenize)

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
        try:
            body = await request.json() if request.can_read_body else {}
            sglang_schema.validate("abort_request", body)
        except ValueError as e:  # json.JSONDecodeError too
            return error_response(400, str(e))
        self.stats["abort_requests"] += 1
        self.abort(None if body.get("abort_all") else body.get("rid") or "")
        return web.json_response({"success": True})

    def abort(self, rid: str | None) -> None:
        """Answer ``rid`` (every request in flight when None: ``abort_all``) as aborted."""
        self.batcher.abort(rid)

    @property
    def inflight(self) -> dict[str, list[_Pending]]:
        return self.batcher.inflight

    @property
    def executor(self) -> ThreadPoolExecutor:
        """The engine's one thread: batches and weight updates never race."""
        return self.batcher.executor

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
                await self.batcher.submit(f"HEALTH_CHECK_{uuid.uuid4().hex}", req)

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
        guard = [] if self.api_key is None else [auth_middleware(self.api_key)]
        app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=guard)
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
        self._batcher = asyncio.create_task(self.batcher.run())

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
