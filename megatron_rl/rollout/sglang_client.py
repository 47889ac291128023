"""The ``sglang`` rollout engine: an async client for SGLang's native HTTP API.

The trainer talks to one URL, ``rollout.urls[0]``: sglang-router in front of the servers (or a
single server). Request and response schemas are SGLang's (:mod:`.sglang_schema`, version cited
there); on CPU machines the servers are :mod:`.server`, which speaks the same API.

How a step's generation works:

* Every sample of every group is its own ``/generate`` request (``n == 1`` with its own
  ``sampling_seed``) with a ``rid`` = (call, request, sample); a retry is sent as
  ``<rid>-retry<k>``, since SGLang answers a rid still in flight with 400 "Duplicate request ID"
  (that answer is retried too). Results go into a slot per sample, so a retried request can
  neither be lost nor counted twice, and the router spreads one group over several servers.
* Concurrency is bounded by a semaphore (``rollout.sglang.max_concurrency``). A request that
  fails with a connection error, a timeout, a 5xx, or comes back aborted by a server we did not
  ask to abort, is retried with exponential back-off and jitter, up to ``max_retries`` times.
  The router runs with its own retries disabled (:mod:`launch.servers`), so every retry is
  ours and is counted in :attr:`SGLangEngine.metrics` (``rollout/sglang/retries``...).
* ``generate(..., need_groups=k)`` returns as soon as ``k`` groups are complete, cancels the
  rest and sends ``/abort_request`` to every server; unfinished groups come back with
  ``finish_reason == "abort"`` completions (never silently dropped).

Weights: ``update_weights_from_disk`` fans out to every worker the router lists (sglang-router
0.3.2 does not forward that endpoint), and records the path and version in
``<sync_dir>/current_weights.json`` so that a restarted server is brought to the current weights
before it is re-added (:mod:`launch.servers`). ``weight_sync: distributed`` uses
:class:`~megatron_rl.rollout.sglang_weights.DistributedWeightSync` (broadcast in buckets over a
group built as SGLang builds it: NCCL on GPUs, gloo against the embedded server on CPUs), and
records each version on disk too, for restarted servers.

Log-probs: SGLang returns ``log_softmax(logits / T)`` (post-temperature), the convention of
:mod:`.base`; nothing is converted. Start SGLang without ``SGLANG_RETURN_ORIGINAL_LOGPROB``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import shutil
import threading
import time
from collections import Counter
from collections.abc import Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import aiohttp

from megatron_rl.rollout import sglang_schema
from megatron_rl.rollout.base import (
    Completion,
    GenRequest,
    RolloutEngine,
    derive_seed,
    register_engine,
)
from megatron_rl.rollout.sglang_weights import DistributedWeightSync

if TYPE_CHECKING:
    from torch import Tensor

    from megatron_rl.rollout.config import RolloutConfig, SGLangConfig

log = logging.getLogger(__name__)
T = TypeVar("T")
WEIGHTS_FILE = "current_weights.json"


class RetryableError(RuntimeError):
    """A request failed in a way another attempt (maybe on another server) can fix."""


class SGLangClient:
    """Async HTTP client for one router/server URL. Create and use it inside one event loop."""

    def __init__(
        self,
        url: str,
        cfg: SGLangConfig,
        request_timeout_s: float,
        routes_shape: tuple[int, int] | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.cfg = cfg
        self.routes_shape = routes_shape  # (layers, top-k): ask for routed experts (MoE)
        self.timeout = aiohttp.ClientTimeout(
            total=request_timeout_s, sock_connect=cfg.connect_timeout_s
        )
        self.metrics: Counter[str] = Counter()
        self._session: aiohttp.ClientSession | None = None
        self._sem = asyncio.Semaphore(cfg.max_concurrency)
        self.live_rids: dict[str, str] = {}  # request rid -> rid of its latest attempt

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            # aiohttp's default pool holds 100 connections: it would cap max_concurrency
            connector = aiohttp.TCPConnector(limit=self.cfg.max_concurrency)
            self._session = aiohttp.ClientSession(timeout=self.timeout, connector=connector)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    # ---- plumbing -------------------------------------------------------------------------
    async def _post(self, url: str, body: dict[str, Any] | None) -> Any:
        """POST JSON; 4xx -> ValueError (not retried), 5xx / network -> RetryableError."""
        try:
            async with self.session.post(url, json=body) as resp:
                text = await resp.text()
                if resp.status >= 500:
                    raise RetryableError(f"{url} answered {resp.status}: {text[:200]}")
                if resp.status >= 400:
                    raise ValueError(f"{url} rejected the request ({resp.status}): {text[:300]}")
        except (TimeoutError, aiohttp.ClientError) as e:
            raise RetryableError(f"{url}: {type(e).__name__}: {e}") from e
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            return text

    async def _get(self, url: str) -> tuple[int, str]:
        try:
            async with self.session.get(url) as resp:
                return resp.status, await resp.text()
        except (TimeoutError, aiohttp.ClientError) as e:
            raise RetryableError(f"{url}: {type(e).__name__}: {e}") from e

    async def _with_retries(self, what: str, make: Any) -> Any:
        delay = self.cfg.retry_backoff_s
        for attempt in range(self.cfg.max_retries + 1):
            try:
                return await make()
            except RetryableError as e:
                if attempt == self.cfg.max_retries:
                    self.metrics["failed"] += 1
                    raise RuntimeError(
                        f"{what} failed after {attempt + 1} attempts; last error: {e}"
                    ) from e
                self.metrics["retries"] += 1
                log.info("retrying %s in %.2f s (attempt %d): %s", what, delay, attempt + 1, e)
                await asyncio.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, self.cfg.retry_max_backoff_s)
        raise AssertionError("unreachable")

    # ---- generation -----------------------------------------------------------------------
    async def generate_one(self, input_ids: list[int], sp: dict[str, Any], rid: str) -> Completion:
        """One sample; retried on failure. ``sp`` is SGLang ``sampling_params`` with n == 1."""
        tries = [0]

        async def attempt() -> Completion:
            body = {
                "rid": self.attempt_rid(rid, tries[0]),
                "input_ids": input_ids,
                "sampling_params": sp,
                "return_logprob": True,
            }
            if self.routes_shape is not None:
                body["return_routed_experts"] = True
            tries[0] += 1
            async with self._sem:
                self.metrics["requests"] += 1
                out = await self._post_generate(body)
            out = out[0] if isinstance(out, list) else out
            c = parse_completion(out, len(input_ids), self.routes_shape)
            if c.finish_reason == "abort":  # a server-side abort we did not ask for
                raise RetryableError(f"request {rid} was aborted by the server")
            return c

        try:
            return await self._with_retries(f"/generate rid={rid}", attempt)
        finally:
            self.live_rids.pop(rid, None)

    def attempt_rid(self, rid: str, attempt: int) -> str:
        """The rid of one attempt: a fresh one per retry (SGLang answers 400 "Duplicate request
        ID" while an earlier attempt with the same rid is still in flight on a server, e.g.
        after a client-side timeout), remembered for :meth:`abort`."""
        live = rid if attempt == 0 else f"{rid}-retry{attempt}"
        self.live_rids[rid] = live
        return live

    async def _post_generate(self, body: dict[str, Any]) -> Any:
        """POST /generate; a duplicate-rid 400 is retryable (the next attempt has a new rid)."""
        try:
            return await self._post(f"{self.url}/generate", body)
        except ValueError as e:
            if "Duplicate request ID" in str(e):
                self.metrics["duplicate_rid"] += 1
                raise RetryableError(str(e)) from e
            raise

    async def generate(
        self, requests: list[GenRequest], call_id: str, seeds: list[int], need_groups: int | None
    ) -> list[list[Completion]]:
        """All groups (or the first ``need_groups`` complete ones, the rest aborted)."""
        slots: list[list[Completion | None]] = [[None] * r.params.n for r in requests]
        tasks: dict[asyncio.Task[Completion], tuple[int, int]] = {}
        for i, req in enumerate(requests):
            for j in range(req.params.n):
                sp = to_sampling_params(req, derive_seed(seeds[i], 0, j))
                coro = self.generate_one(req.prompt_ids, sp, f"{call_id}-{i}-{j}")
                tasks[asyncio.ensure_future(coro)] = (i, j)
        remaining = [r.params.n for r in requests]
        groups_done = 0
        pending = set(tasks)
        try:
            while pending and (need_groups is None or groups_done < need_groups):
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for t in done:
                    i, j = tasks[t]
                    slots[i][j] = t.result()  # raises RuntimeError after max_retries
                    remaining[i] -= 1
                    groups_done += remaining[i] == 0
        finally:
            if pending:
                rids = [f"{call_id}-{tasks[t][0]}-{tasks[t][1]}" for t in pending]
                rids = [self.live_rids.get(r, r) for r in rids]
                await self.abort(pending, rids)
        abort = Completion(token_ids=[], text="", logprobs=[], finish_reason="abort")
        return [[c if c is not None else abort for c in group] for group in slots]

    async def abort(self, pending: set[asyncio.Task[Completion]], rids: list[str]) -> None:
        """Cancel local tasks and ask every server to drop these request ids (``AbortReq``
        carries one rid; sglang-router 0.3.2 does not forward /abort_request, so we fan out)."""
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        self.metrics["aborted"] += len(pending)

        async def one(url: str, rid: str) -> None:
            try:
                await self._post(f"{url}/abort_request", {"rid": rid})
            except (RetryableError, ValueError) as e:
                log.warning("abort of %s on %s failed (%s); late results are dropped", rid, url, e)

        urls = await self.worker_urls()
        await asyncio.gather(*(one(u, r) for u in urls for r in rids))

    # ---- workers and weights --------------------------------------------------------------
    async def worker_urls(self) -> list[str]:
        """The servers behind the router (``GET /workers``), or [url] for a bare server."""
        status, text = await self._get(f"{self.url}/workers")
        if status == 200:
            data = json.loads(text)
            return [w["url"].rstrip("/") for w in data.get("workers", [])]
        return [self.url]

    async def wait_healthy(self, timeout_s: float) -> None:
        """Wait for ``/health`` 200 and at least one worker; ValueError after timeout_s."""
        deadline = time.monotonic() + timeout_s
        last = "no answer"
        while time.monotonic() < deadline:
            try:
                status, text = await self._get(f"{self.url}/health")
                if status == 200 and await self.worker_urls():
                    return
                last = f"HTTP {status}: {text[:100]}"
            except RetryableError as e:
                last = str(e)
            await asyncio.sleep(0.5)
        raise ValueError(
            f"rollout server/router {self.url} is not healthy after {timeout_s:.0f} s ({last}); "
            "check rollout.urls and that the servers and router are running"
        )

    async def update_weights_from_disk(
        self, path: str, version: str, urls: list[str] | None = None
    ) -> None:
        """Every worker (or only ``urls``) loads ``path`` as ``version``."""
        body = {"model_path": path, "weight_version": version, "flush_cache": True}
        urls = urls if urls is not None else await self.worker_urls()
        if not urls:
            raise RuntimeError(f"router {self.url} lists no workers to update")

        async def one(url: str) -> None:
            out = await self._with_retries(
                f"{url}/update_weights_from_disk",
                lambda: self._post(f"{url}/update_weights_from_disk", body),
            )
            if not (isinstance(out, dict) and out.get("success")):
                raise RuntimeError(f"{url} failed to load weights from {path}: {out}")

        await asyncio.gather(*(one(u) for u in urls))


def recorded_version(sync_dir: Path) -> int:
    """The version in ``<sync_dir>/current_weights.json`` (0 when there is none): a resumed
    trainer continues from it, so ``v<version>`` folders and versions never go back."""
    try:
        return int(json.loads((sync_dir / WEIGHTS_FILE).read_text())["version"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def to_sampling_params(req: GenRequest, seed: int) -> dict[str, Any]:
    """SGLang ``sampling_params`` for one sample of ``req``."""
    p = req.params
    sp: dict[str, Any] = {
        "max_new_tokens": p.max_tokens,
        "temperature": p.temperature,
        "top_p": p.top_p,
        "n": 1,
        "sampling_seed": int(seed),
    }
    if p.stop:
        sp["stop"] = list(p.stop)
    if p.stop_token_ids:
        sp["stop_token_ids"] = list(p.stop_token_ids)
    return sp


def parse_completion(
    out: dict[str, Any], prompt_len: int = 0, routes_shape: tuple[int, int] | None = None
) -> Completion:
    """A :class:`Completion` from one SGLang ``/generate`` output object.

    ``routes_shape`` (layers, top-k): decode ``meta_info["routed_experts"]`` (base64 int32,
    ``[prompt_len + completion - 1, layers, top-k]``; see ``sglang_schema``).
    """
    meta = out["meta_info"]
    triples = meta.get("output_token_logprobs") or []
    token_ids = [int(t) for t in out["output_ids"]]
    if len(triples) != len(token_ids):
        raise RetryableError(
            f"rid {meta.get('id')}: {len(triples)} log-probs for {len(token_ids)} tokens"
        )
    kind = (meta.get("finish_reason") or {}).get("type", "stop")
    reason = {"length": "length", "abort": "abort"}.get(kind, "stop")
    routes = None
    if routes_shape is not None and reason != "abort":
        routes = sglang_schema.decode_routed_experts(meta, prompt_len + len(token_ids) - 1,
                                                     routes_shape)  # fmt: skip
    return Completion(
        token_ids=token_ids,
        text=out.get("text", ""),
        logprobs=[float(t[0]) for t in triples],
        finish_reason=reason,  # type: ignore[arg-type]
        routed_experts=routes,
    )


@register_engine("sglang")
class SGLangEngine(RolloutEngine):
    """Synchronous :class:`RolloutEngine` over :class:`SGLangClient` (loop in a thread)."""

    def __init__(self, cfg: RolloutConfig, model_dir: str, seed: int) -> None:
        if not cfg.urls:
            raise ValueError("rollout.engine=sglang needs rollout.urls=[http://ROUTER:PORT]")
        self.cfg = cfg
        self.seed = seed
        self.calls = 0
        self.model_dir = model_dir
        self.routed_experts = cfg.return_routed_experts
        self.sync_dir = Path(cfg.sync_dir or Path(model_dir).parent / "rollout_weights")
        self.version = recorded_version(self.sync_dir)  # versions only grow, across restarts
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self.client = self._run(self._make_client())
        self._run(self.client.wait_healthy(cfg.sglang.health_timeout_s))
        self._sync: Any = None
        if any(Path(model_dir).glob("*.safetensors")):
            # The servers may hold other weights (base model; a resumed run's policy differs).
            self.update_weights_from_disk(model_dir)

    async def _make_client(self) -> SGLangClient:
        shape = self._routes_shape() if self.routed_experts else None
        return SGLangClient(self.cfg.urls[0], self.cfg.sglang, self.cfg.request_timeout_s, shape)

    def _routes_shape(self) -> tuple[int, int]:
        """(layers, top-k) of the served MoE model, from its ``config.json``."""
        config = json.loads((Path(self.model_dir) / "config.json").read_text())
        if not config.get("num_experts_per_tok"):
            raise ValueError(f"rollout.return_routed_experts=true: {self.model_dir}/config.json "
                             "has no num_experts_per_tok (not an MoE model)")  # fmt: skip
        return int(config["num_hidden_layers"]), int(config["num_experts_per_tok"])

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    @property
    def metrics(self) -> dict[str, float]:
        """Counters since start: requests, retries, failed, aborted (namespaced keys)."""
        return {f"rollout/sglang/{k}": float(v) for k, v in self.client.metrics.items()}

    def _post_async(self, url: str, body: dict[str, Any]) -> Any:
        """Start a POST on the client loop; returns a concurrent future (no waiting)."""
        return asyncio.run_coroutine_threadsafe(self.client._post(url, body), self._loop)

    def generate(
        self, requests: list[GenRequest], need_groups: int | None = None
    ) -> list[list[Completion]]:
        call = self.calls
        self.calls += 1
        seeds = [
            r.params.seed if r.params.seed is not None else derive_seed(self.seed, call, i)
            for i, r in enumerate(requests)
        ]
        call_id = f"s{self.seed}-c{call}-{time.monotonic_ns() % 10**9}"
        return self._run(self.client.generate(requests, call_id, seeds, need_groups))

    def update_weights_from_disk(self, hf_dir: str) -> float:
        t0 = time.perf_counter()
        self.version += 1
        version = str(self.version)
        self._run(self.client.update_weights_from_disk(str(Path(hf_dir).resolve()), version))
        self._record(str(Path(hf_dir).resolve()), version)
        return time.perf_counter() - t0

    def update_weights(self, hf_state_dict: dict[str, Tensor]) -> float:
        if self.cfg.sglang.weight_sync == "distributed":
            return self._update_distributed(hf_state_dict)
        t0 = time.perf_counter()
        out = self._write_version(hf_state_dict, self.version + 1)
        return time.perf_counter() - t0 + self.update_weights_from_disk(str(out))

    def _write_version(self, hf_state_dict: dict[str, Tensor], version: int) -> Path:
        """``<sync_dir>/v<version>`` (servers read it: must be shared disk); keeps two."""
        from megatron_rl.rollout.weight_sync import write_safetensors

        out = self.sync_dir / f"v{version:06d}"
        write_safetensors(hf_state_dict, out)
        for old in sorted(self.sync_dir.glob("v*"))[:-2]:  # keep the current and previous
            shutil.rmtree(old, ignore_errors=True)
        return out

    def _update_distributed(self, hf_state_dict: dict[str, Tensor]) -> float:
        """Broadcast to every server; with ``record_weights`` the version is also written to
        disk and recorded, so a server the fleet restarts loads it before taking traffic."""
        if self._sync is None:
            self._sync = DistributedWeightSync(
                self.cfg.sglang,
                self._post_async,
                lambda: self._run(self.client.worker_urls()),
                router_url=self.cfg.urls[0],
            )
        t0 = time.perf_counter()
        self.version += 1
        self._sync.update(hf_state_dict, str(self.version))
        if self.cfg.sglang.record_weights:
            out = self._write_version(hf_state_dict, self.version)
            self._record(str(out.resolve()), str(self.version))
            self._catch_up(str(out.resolve()), str(self.version))
        return time.perf_counter() - t0

    def _catch_up(self, path: str, version: str) -> None:
        """A server the fleet re-added while this version was broadcast (it loaded the version
        recorded before, and was not in the group) loads this one from disk now."""
        assert self._sync is not None
        late = sorted(set(self._run(self.client.worker_urls())) - set(self._sync.members))
        if late:
            log.warning("%s joined during the broadcast of version %s: loading it", late, version)
            self._run(self.client.update_weights_from_disk(path, version, urls=late))

    def _record(self, path: str, version: str) -> None:
        """``<sync_dir>/current_weights.json``: what a restarted server must load."""
        self.sync_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.sync_dir / (WEIGHTS_FILE + ".tmp")
        tmp.write_text(json.dumps({"path": path, "version": version}))
        tmp.replace(self.sync_dir / WEIGHTS_FILE)

    def shutdown(self) -> None:
        if self._loop.is_closed():
            return
        if self._sync is not None:  # servers drop the group (a new trainer builds its own)
            try:
                self._sync.teardown()
            except Exception as e:
                log.warning("weight-update group teardown failed: %s", e)
        self._run(self.client.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._loop.close()
