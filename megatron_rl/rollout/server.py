"""An embedded server that speaks SGLang's native HTTP API on top of any :class:`RolloutEngine`.

On a GPU cluster the rollout servers are real SGLang; on a laptop or in CI this server stands in
for them, so the exact client (:mod:`megatron_rl.rollout.sglang_client`), sglang-router and the
launchers run end to end without a GPU. Endpoints (schemas in :mod:`.sglang_schema`):

* ``POST /generate``: ``input_ids`` (one prompt or a batch), ``sampling_params`` (one dict or
  one per prompt, ``n`` completions each), ``return_logprob``; the response is one object for a
  single prompt with ``n == 1``, else a list in prompt-major order (prompt 0's ``n`` samples,
  then prompt 1's...), as SGLang returns them.
* ``GET /health``, ``GET /health_generate`` (a one-token generation through the batcher),
  ``GET|POST /flush_cache``, ``POST /abort_request``, ``POST /update_weights_from_disk``,
  ``GET /get_model_info`` and ``/get_server_info`` (plus the ``/model_info`` and
  ``/server_info`` spellings sglang-router 0.3.2 probes when a worker registers).

Design: HTTP handlers put requests on a queue; one batcher task drains it into a single
``engine.generate`` call (continuous batching at request granularity: everything that arrived
while the previous batch ran goes into the next one). The engine runs in a single worker thread,
which also runs weight updates, so an update never races a batch. ``/abort_request`` answers the
aborted requests at once with ``finish_reason.type == "abort"``; a batch already inside the
engine finishes there and its result for them is dropped. ``/update_weights_from_disk`` is not
implemented by SGLang's ``load_format`` machinery: it calls the engine's
``update_weights_from_disk`` on a folder of HF ``*.safetensors``.
"""

from __future__ import annotations

import asyncio
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

log = logging.getLogger(__name__)

_TOP_K_ALL = 1 << 30  # SGLang's "whole vocabulary" top_k


@dataclass
class _Pending:
    """One prompt of a /generate call waiting for its ``n`` completions."""

    rid: str
    request: GenRequest
    future: asyncio.Future[list[Completion]] = field(repr=False)


def to_gen_request(input_ids: list[int], sp: dict[str, Any]) -> GenRequest:
    """Map SGLang ``sampling_params`` onto our :class:`SamplingParams`; reject what we lack."""
    for key, neutral in (("min_p", 0.0), ("frequency_penalty", 0.0), ("presence_penalty", 0.0)):
        if sp.get(key) not in (None, neutral):
            raise ValueError(f"the embedded server does not support sampling_params.{key}")
    if sp.get("repetition_penalty") not in (None, 1.0):
        raise ValueError("the embedded server does not support sampling_params.repetition_penalty")
    if sp.get("top_k") not in (None, -1, _TOP_K_ALL):
        raise ValueError("the embedded server does not support sampling_params.top_k")
    for key in ("json_schema", "regex", "ebnf", "structural_tag", "stop_regex", "logit_bias"):
        if sp.get(key):
            raise ValueError(f"the embedded server does not support sampling_params.{key}")
    stop = sp.get("stop") or []
    params = SamplingParams(
        temperature=1.0 if sp.get("temperature") is None else float(sp["temperature"]),
        top_p=1.0 if sp.get("top_p") is None else float(sp["top_p"]),
        max_tokens=128 if sp.get("max_new_tokens") is None else int(sp["max_new_tokens"]),
        stop=[stop] if isinstance(stop, str) else list(stop),
        stop_token_ids=list(sp.get("stop_token_ids") or []),
        seed=sp.get("sampling_seed"),
        n=1 if sp.get("n") is None else int(sp["n"]),
    )
    params.validate()
    return GenRequest(prompt_ids=list(input_ids), params=params)


def completion_to_sglang(
    c: Completion, rid: str, prompt_len: int, return_logprob: bool, weight_version: str
) -> dict[str, Any]:
    """One SGLang ``/generate`` output object for one completion."""
    finish: dict[str, Any]
    if c.finish_reason == "length":
        finish = {"type": "length", "length": len(c.token_ids)}
    elif c.finish_reason == "abort":
        finish = {"type": "abort", "message": "aborted"}
    else:
        finish = {"type": "stop", "matched": c.token_ids[-1] if c.token_ids else None}
    meta: dict[str, Any] = {
        "id": rid,
        "finish_reason": finish,
        "prompt_tokens": prompt_len,
        "completion_tokens": len(c.token_ids),
        "cached_tokens": 0,
        "weight_version": weight_version,
    }
    if return_logprob:
        meta["output_token_logprobs"] = [
            [float(lp), int(t), None] for lp, t in zip(c.logprobs, c.token_ids, strict=True)
        ]
    return {"text": c.text, "output_ids": list(c.token_ids), "meta_info": meta}


def _aborted(n: int) -> list[Completion]:
    return [Completion(token_ids=[], text="", logprobs=[], finish_reason="abort")] * n


class EmbeddedServer:
    """SGLang-native HTTP front for one engine. ``app()`` gives the aiohttp application."""

    def __init__(self, engine: RolloutEngine, model_path: str, max_batch: int = 256) -> None:
        self.engine = engine
        self.model_path = model_path
        self.max_batch = max_batch  # most sequences (prompts x n) per engine call
        self.weight_version = "default"
        self.queue: asyncio.Queue[_Pending] = asyncio.Queue()
        self.inflight: dict[str, list[_Pending]] = {}
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine")
        self.stats = {"requests": 0, "batches": 0, "aborted": 0, "weight_updates": 0}
        self._batcher: asyncio.Task[None] | None = None

    # ---- batching -------------------------------------------------------------------------
    async def _run_batches(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = [await self.queue.get()]
            seqs = batch[0].request.params.n
            while not self.queue.empty() and seqs < self.max_batch:
                batch.append(self.queue.get_nowait())
                seqs += batch[-1].request.params.n
            batch = [p for p in batch if not p.future.done()]  # drop aborted ones
            if not batch:
                continue
            self.stats["batches"] += 1
            try:
                outs = await loop.run_in_executor(
                    self.executor, self.engine.generate, [p.request for p in batch]
                )
            except Exception as e:  # reported to every waiting request, server keeps serving
                log.exception("engine.generate failed on a batch of %d prompts", len(batch))
                for p in batch:
                    if not p.future.done():
                        p.future.set_exception(RuntimeError(f"engine.generate failed: {e}"))
                continue
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

    # ---- handlers -------------------------------------------------------------------------
    async def generate(self, request: web.Request) -> web.Response:
        body = await request.json()
        try:
            sglang_schema.validate("generate", body)
            sglang_schema.check_supported_generate(body)
            prompts, sps, rids, single = _normalize_generate(body)
            reqs = [to_gen_request(ids, sp) for ids, sp in zip(prompts, sps, strict=True)]
        except ValueError as e:
            return web.json_response({"error": {"message": str(e)}}, status=400)
        self.stats["requests"] += 1
        subs = [self._submit(r, q) for r, q in zip(rids, reqs, strict=True)]
        results = await asyncio.gather(*subs)
        want_lp = bool(body.get("return_logprob"))
        outs = []
        for rid, req, comps in zip(rids, reqs, results, strict=True):
            for j, c in enumerate(comps):
                sub = rid if req.params.n == 1 else f"{rid}-{j}"
                outs.append(
                    completion_to_sglang(c, sub, len(req.prompt_ids), want_lp, self.weight_version)
                )
        return web.json_response(outs[0] if single and len(outs) == 1 else outs)

    async def abort_request(self, request: web.Request) -> web.Response:
        body = await request.json() if request.can_read_body else {}
        sglang_schema.validate("abort_request", body)
        rids = list(self.inflight) if body.get("abort_all") else [body.get("rid") or ""]
        for rid in rids:
            for p in list(self.inflight.get(rid, [])):
                if not p.future.done():
                    p.future.set_result(_aborted(p.request.params.n))
                    self.stats["aborted"] += 1
        return web.json_response({"success": True})

    async def update_weights_from_disk(self, request: web.Request) -> web.Response:
        body = await request.json()
        try:
            sglang_schema.validate("update_weights_from_disk", body)
        except ValueError as e:
            return web.json_response({"success": False, "message": str(e)}, status=400)
        loop = asyncio.get_running_loop()
        path = body["model_path"]
        try:
            secs = await loop.run_in_executor(
                self.executor, self.engine.update_weights_from_disk, path
            )
        except Exception as e:
            log.exception("update_weights_from_disk(%s) failed", path)
            msg = f"update_weights_from_disk({path}) failed: {e}"
            return web.json_response({"success": False, "message": msg}, status=400)
        self.weight_version = body.get("weight_version") or self.weight_version
        self.stats["weight_updates"] += 1
        msg = f"loaded {path} as weight_version={self.weight_version} in {secs:.3f} s"
        return web.json_response({"success": True, "message": msg, "num_paused_requests": 0})

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(text="OK")

    async def health_generate(self, request: web.Request) -> web.Response:
        req = GenRequest(prompt_ids=[0], params=SamplingParams(max_tokens=1, seed=0))
        try:
            await asyncio.wait_for(self._submit(f"health-{uuid.uuid4().hex}", req), 60)
        except Exception as e:
            return web.Response(status=503, text=f"health_generate failed: {e}")
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
        return web.json_response(info)

    # ---- application ----------------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application(client_max_size=256 * 1024**2)
        r = app.router
        r.add_post("/generate", self.generate)
        r.add_get("/health", self.health)
        r.add_get("/health_generate", self.health_generate)
        r.add_route("*", "/flush_cache", self.flush_cache)
        r.add_post("/abort_request", self.abort_request)
        r.add_post("/update_weights_from_disk", self.update_weights_from_disk)
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


def _normalize_generate(
    body: dict[str, Any],
) -> tuple[list[list[int]], list[dict[str, Any]], list[str], bool]:
    """(prompts, sampling params per prompt, rid per prompt, is_single) from a /generate body."""
    ids = body["input_ids"]
    single = bool(ids) and isinstance(ids[0], int)
    prompts: list[list[int]] = [ids] if single else ids
    sp = body.get("sampling_params") or {}
    sps = list(sp) if isinstance(sp, list) else [sp] * len(prompts)
    if len(sps) != len(prompts):
        raise ValueError(f"{len(sps)} sampling_params for {len(prompts)} prompts")
    rid = body.get("rid")
    if isinstance(rid, list):
        rids = list(rid)
    elif single:
        rids = [rid or uuid.uuid4().hex]
    else:
        rids = [f"{rid}-{i}" if rid else uuid.uuid4().hex for i in range(len(prompts))]
    if len(rids) != len(prompts):
        raise ValueError(f"{len(rids)} rids for {len(prompts)} prompts")
    return prompts, sps, rids, single


def serve(engine: RolloutEngine, model_path: str, host: str, port: int, max_batch: int) -> None:
    """Serve until SIGINT/SIGTERM; the engine is shut down on the way out."""
    server = EmbeddedServer(engine, model_path, max_batch=max_batch)
    t0 = time.monotonic()
    log.info("embedded SGLang-compatible server on http://%s:%d (model %s)", host, port, model_path)
    # shutdown_timeout: the router holds keep-alive connections; do not wait for them on exit.
    web.run_app(
        server.app(), host=host, port=port, print=None, handle_signals=True, shutdown_timeout=2
    )
    log.info("server on port %d stopped after %.1f s", port, time.monotonic() - t0)
