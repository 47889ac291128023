"""The async HTTP client under the ``sglang`` engine (:mod:`.sglang_client`): one router URL.

Requests, retries, rids, concurrency and aborts as :mod:`.sglang_client`'s docstring describes;
schemas in :mod:`.sglang_schema`. Create and use a client inside one event loop.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

import aiohttp

from megatron_rl.rollout import sglang_schema
from megatron_rl.rollout.auth import bearer
from megatron_rl.rollout.base import Completion, GenRequest, derive_seed

if TYPE_CHECKING:
    from megatron_rl.rollout.config import SGLangConfig

log = logging.getLogger(__name__)
ABORT_GRACE_S = 5.0  # how long aborted requests get to come back before the next abort round
ABORTED = Completion(token_ids=[], text="", logprobs=[], finish_reason="abort")


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
        api_key: str | None = None,
        key_setting: str = "rollout.sglang.api_key_file",
    ) -> None:
        self.url = url.rstrip("/")
        self.headers = bearer(api_key)  # on every request (rollout/auth.py)
        self.key_setting = key_setting  # the config key a 401/403 tells the user to set
        self.cfg = cfg
        self.routes_shape = routes_shape  # (layers, top-k): ask for routed experts (MoE)
        self.timeout = aiohttp.ClientTimeout(
            total=request_timeout_s, sock_connect=cfg.connect_timeout_s
        )
        self.metrics: Counter[str] = Counter()
        self._session: aiohttp.ClientSession | None = None
        self._sem = asyncio.Semaphore(cfg.max_concurrency)
        self.live_rids: dict[str, str] = {}  # request rid -> rid of its latest attempt
        self.sent: set[str] = set()  # request rids with an attempt on a server now
        self.aborting = False  # an abort is under way: aborted answers are final

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            # aiohttp's default pool holds 100 connections: it would cap max_concurrency
            connector = aiohttp.TCPConnector(limit=self.cfg.max_concurrency)
            self._session = aiohttp.ClientSession(
                timeout=self.timeout, connector=connector, headers=self.headers
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    # ---- plumbing -------------------------------------------------------------------------
    async def _post(
        self, url: str, body: dict[str, Any] | None, timeout_s: float | None = None
    ) -> Any:
        """POST JSON; 4xx -> ValueError (not retried), 5xx / network -> RetryableError.
        ``timeout_s`` replaces ``request_timeout_s`` for this call."""
        timeout = None if timeout_s is None else aiohttp.ClientTimeout(total=timeout_s)
        try:
            async with self.session.post(url, json=body, timeout=timeout) as resp:
                text = await resp.text()
                if resp.status >= 500 or resp.status == 429:  # 429: busy, back off and retry
                    if resp.status == 429:
                        self.metrics["busy"] += 1
                    raise RetryableError(f"{url} answered {resp.status}: {text[:200]}")
                if resp.status in (401, 403):
                    raise ValueError(self.unauthorized(url, resp.status))
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
                if self.aborting:
                    return ABORTED
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

    def unauthorized(self, url: str, status: int) -> str:
        """The error for a 401/403: whether a key was sent, and where a key comes from."""
        what = "refused the API key sent" if self.headers else "needs an API key and none was found"
        return (
            f"{url} answered {status}: it {what}; set $MEGATRON_RL_API_KEY or "
            f"{self.key_setting} to the server's key (a fleet's is its <run-dir>/api_key)"
        )

    # ---- generation -----------------------------------------------------------------------
    async def generate_one(self, input_ids: list[int], sp: dict[str, Any], rid: str) -> Completion:
        """One sample; retried on failure. ``sp`` is SGLang ``sampling_params`` with n == 1."""
        tries = [0]

        async def attempt() -> Completion:
            if self.aborting:  # a retry that comes after the abort is not sent
                return ABORTED
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
                if self.aborting:
                    return ABORTED
                self.metrics["requests"] += 1
                self.sent.add(rid)
                try:
                    out = await self._post_generate(body)
                finally:
                    self.sent.discard(rid)
            out = out[0] if isinstance(out, list) else out
            c = parse_completion(out, len(input_ids), self.routes_shape)
            if c.finish_reason == "abort" and not self.aborting:  # not asked for: retried
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
                seed = derive_seed(seeds[i], 0, j) if self.cfg.deterministic else None
                sp = to_sampling_params(req, seed)
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
                await self.abort({t: f"{call_id}-{tasks[t][0]}-{tasks[t][1]}" for t in pending})
        return [[c if c is not None else ABORTED for c in group] for group in slots]

    async def abort(self, pending: dict[asyncio.Task[Completion], str]) -> None:
        """Stop these requests (task -> request rid): see the module docstring."""
        self.aborting = True
        try:
            on_server = {t for t, rid in pending.items() if rid in self.sent}
            for t in set(pending) - on_server:
                t.cancel()  # never sent, or between retries: nothing to stop on a server
            urls = await self.worker_urls()
            for _ in range(2):  # the 2nd round: a request a server got after the 1st abort
                if not on_server:
                    break
                await self.abort_all(urls)
                _, on_server = await asyncio.wait(on_server, timeout=ABORT_GRACE_S)
            for t in on_server:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        finally:
            self.aborting = False
        self.metrics["aborted"] += len(pending)

    async def abort_all(self, urls: list[str]) -> None:
        """One ``AbortReq(abort_all=True)`` per server (SGLang's ``io_struct.AbortReq``)."""

        async def one(url: str) -> None:
            try:
                await self._post(f"{url}/abort_request", {"rid": "", "abort_all": True}, 30)
                self.metrics["abort_posts"] += 1
            except (RetryableError, ValueError) as e:
                log.warning("abort_all on %s failed (%s); late results are dropped", url, e)

        await asyncio.gather(*(one(u) for u in urls))

    # ---- workers and weights --------------------------------------------------------------
    async def worker_urls(self) -> list[str]:
        """The servers behind the router (``GET /workers``), or [url] for a bare server."""
        status, text = await self._get(f"{self.url}/workers")
        if status in (401, 403):
            raise ValueError(self.unauthorized(f"{self.url}/workers", status))
        if status == 200:
            data = json.loads(text)
            return [w["url"].rstrip("/") for w in data.get("workers", [])]
        return [self.url]

    async def alive(self, url: str) -> bool:
        """Whether anything answers HTTP at ``url`` (``/get_model_info``: never behind the
        update lock, so a server in a long weight update still counts as alive)."""
        try:
            async with self.session.get(
                f"{url}/get_model_info", timeout=aiohttp.ClientTimeout(total=5)
            ) as resp:
                await resp.read()
                return True
        except (TimeoutError, aiohttp.ClientError):
            return False

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


def to_sampling_params(req: GenRequest, seed: int | None) -> dict[str, Any]:
    """SGLang ``sampling_params`` for one sample of ``req`` (``sampling_seed`` when given)."""
    p = req.params
    sp: dict[str, Any] = {
        "max_new_tokens": p.max_tokens,
        "temperature": p.temperature,
        "top_p": p.top_p,
        "n": 1,
    }
    if seed is not None:
        sp["sampling_seed"] = int(seed)
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
        routes = sglang_schema.decode_routed_experts(
            meta, prompt_len + len(token_ids) - 1, routes_shape
        )
    return Completion(
        token_ids=token_ids,
        text=out.get("text", ""),
        logprobs=[float(t[0]) for t in triples],
        finish_reason=reason,  # type: ignore[arg-type]
        routed_experts=routes,
    )
