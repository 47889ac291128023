"""The embedded server's load bounds (megatron_rl/rollout/server_guard.py, server_requests.py):
a request of millions of tiny prompts is refused at once without stalling the event loop, a
request past the token bound is refused, a full queue answers 429 with Retry-After, and the
SGLang client backs off and retries a 429 until its samples are in.

Real EmbeddedServer (aiohttp on loopback, in a thread) over the real ``hf`` engine on the shipped
models/tiny-base, with the API key on, as ``megatron-rl serve`` runs it.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import torch
from test_sglang import ServerThread

from launch.servers import http
from megatron_rl.rollout.auth import bearer
from megatron_rl.rollout.base import GenRequest, SamplingParams
from megatron_rl.rollout.config import RolloutConfig, SGLangConfig
from megatron_rl.rollout.hf_engine import HFEngine
from megatron_rl.rollout.server import EmbeddedServer
from megatron_rl.rollout.sglang_http import SGLangClient

torch.set_num_threads(1)
MODEL = Path(__file__).resolve().parents[2] / "models" / "tiny-base"
KEY = "bounds-test-key-0123456789abcdef"


class SlowEngine(HFEngine):
    """The real hf engine, half a second slower per batch, so that requests pile up."""

    def generate(self, requests: list[GenRequest]) -> Any:
        time.sleep(0.5)
        return super().generate(requests)


@pytest.fixture(scope="module")
def served():
    engine = SlowEngine(RolloutConfig(engine="hf"), str(MODEL), seed=0)
    server = EmbeddedServer(
        engine, str(MODEL), api_key=KEY, max_batch=2, max_tokens=2000, max_queued=4
    )
    st = ServerThread(server)
    yield st, server
    st.close()


def test_millions_of_tiny_prompts_are_refused_at_once_and_health_stays_up(served) -> None:
    st, _ = served
    body = {"input_ids": [[7]] * 2_000_000, "sampling_params": {"max_new_tokens": 1}}
    data = json.dumps(body).encode()  # 10 MB, encoded before the clock starts
    health: list[float] = []

    def probe() -> None:  # while the big body is being read and refused
        time.sleep(0.3)
        t0 = time.monotonic()
        assert http("GET", f"{st.url}/health", timeout=30)[0] == 200
        health.append(time.monotonic() - t0)

    t = threading.Thread(target=probe)
    t.start()
    t0 = time.monotonic()
    status, text = _post_raw(f"{st.url}/generate", data)
    took = time.monotonic() - t0
    t.join(30)
    assert status == 400 and "2000000 prompts" in text and "at most 1024" in text, text[:300]
    # one JSON decode (~1 s for 10 MB on this machine, off the loop) and a len(), not a schema
    # walk over 2M items (minutes before); the loop answers the health check meanwhile (its
    # one-token generation takes 0.5 s on the slow engine)
    assert took < 10, took
    assert health and health[0] < 10, health


def _post_raw(url: str, data: bytes) -> tuple[int, str]:
    req = urllib.request.Request(url, data=data, method="POST", headers=bearer(KEY))
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_a_request_past_the_token_bound_is_refused_with_both_numbers(served) -> None:
    st, _ = served
    body = {"input_ids": [[5, 6, 7]] * 10, "sampling_params": {"max_new_tokens": 300}}
    status, text = http("POST", f"{st.url}/generate", body, timeout=30, key=KEY)
    assert status == 400 and "3030 tokens" in text and "at most 2000" in text, text[:300]


async def _burst(url: str, n: int) -> list[tuple[int, dict[str, str]]]:
    body = {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 2}}
    headers = {"Authorization": f"Bearer {KEY}"}

    async def one(s: aiohttp.ClientSession) -> tuple[int, dict[str, str]]:
        async with s.post(f"{url}/generate", json=body, headers=headers) as r:
            await r.read()
            return r.status, dict(r.headers)

    async with aiohttp.ClientSession() as s:
        return await asyncio.gather(*(one(s) for _ in range(n)))


def test_a_full_queue_answers_429_and_the_client_retries_until_served(served) -> None:
    st, server = served
    answers = asyncio.run(_burst(st.url, 12))
    codes = sorted(code for code, _ in answers)
    assert codes.count(200) >= 4 and codes.count(429) >= 1, codes
    assert all(h.get("Retry-After") == "1" for code, h in answers if code == 429)
    assert server.queued.used == 0  # every reservation given back
    too_big = {"input_ids": [[5]] * 3, "sampling_params": {"max_new_tokens": 1, "n": 2}}
    status, text = http("POST", f"{st.url}/generate", too_big, timeout=30, key=KEY)
    assert status == 400 and "queues at most 4" in text, text  # can never fit: not a 429

    cfg = SGLangConfig(max_concurrency=12, max_retries=30, retry_backoff_s=0.05)

    async def run() -> tuple[list[Any], dict[str, int]]:
        client = SGLangClient(st.url, cfg, request_timeout_s=60, api_key=KEY)
        try:
            reqs = [GenRequest([5 + i, 6], SamplingParams(max_tokens=2, n=3)) for i in range(4)]
            out = await client.generate(reqs, "bounds", [0, 1, 2, 3], None)
            return out, dict(client.metrics)
        finally:
            await client.close()

    out, metrics = asyncio.run(run())
    assert [len(g) for g in out] == [3] * 4
    assert all(c.finish_reason != "abort" and 1 <= len(c.token_ids) <= 2 for g in out for c in g)
    assert metrics.get("busy", 0) >= 1 and metrics.get("failed", 0) == 0, metrics
    assert json.loads(http("GET", f"{st.url}/get_server_info", key=KEY)[1])["stats"]["busy"] >= 1
