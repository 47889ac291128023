"""Request ids on retries: SGLang rejects a rid that is still in flight with HTTP 400.

SGLang's ``TokenizerManager`` (sgl-project/sglang
``python/sglang/srt/managers/tokenizer_manager.py``) raises ``ValueError("Duplicate request ID
detected: <rid>")`` for a rid already in ``rid_to_state``, which the HTTP server answers with
400. A client retry after a client-side timeout hits exactly that while the first attempt still
runs on the server. The embedded server does what SGLang does; the client gives every retry a
fresh rid, and aborts the latest one.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest
import torch
from test_sglang import ServerThread

from benchmarks.tiny_model import make_tiny_qwen2
from launch.servers import http
from megatron_rl.rollout.base import GenRequest, SamplingParams
from megatron_rl.rollout.config import RolloutConfig, SGLangConfig
from megatron_rl.rollout.hf_engine import HFEngine
from megatron_rl.rollout.server import EmbeddedServer
from megatron_rl.rollout.sglang_client import SGLangClient, to_sampling_params

torch.set_num_threads(1)


class GatedEngine(HFEngine):
    """The hf engine, whose first batch waits until the test opens the gate."""

    def __init__(self, *a, **kw) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*a, **kw)
        self.gate = threading.Event()
        self.batches = 0

    def generate(self, requests):  # type: ignore[no-untyped-def]
        self.batches += 1
        if self.batches == 1:
            assert self.gate.wait(120)
        return super().generate(requests)


@pytest.fixture()
def gated(tmp_path: Path):
    model = make_tiny_qwen2(tmp_path / "m", "test", seed=0)
    engine = GatedEngine(RolloutConfig(engine="hf"), str(model), seed=0)
    st = ServerThread(EmbeddedServer(engine, str(model), api_key=None))
    yield st, engine
    engine.gate.set()
    st.close()


def _body(rid: str) -> dict:
    req = GenRequest([5, 17, 42], SamplingParams(max_tokens=4, seed=1))
    return {"rid": rid, "input_ids": req.prompt_ids, "return_logprob": True,
            "sampling_params": to_sampling_params(req, 1)}  # fmt: skip


def test_retry_of_an_in_flight_rid_gets_a_fresh_rid(gated) -> None:
    st, engine = gated
    first: dict[str, tuple[int, str]] = {}
    t = threading.Thread(target=lambda: first.update(a=http("POST", f"{st.url}/generate",
                         _body("call-0-0"), timeout=120)))  # fmt: skip
    t.start()
    deadline = time.monotonic() + 60
    while engine.batches < 1 and time.monotonic() < deadline:
        time.sleep(0.05)  # until the first attempt is inside the engine
    status, text = http("POST", f"{st.url}/generate", _body("call-0-0"), timeout=30)
    assert status == 400 and "Duplicate request ID detected: call-0-0" in text

    cfg = SGLangConfig(retry_backoff_s=0.05, max_retries=3)

    async def run():  # the client's own attempt with the same rid: 400, then a fresh rid
        client = SGLangClient(st.url, cfg, request_timeout_s=60)
        try:
            task = asyncio.ensure_future(
                client.generate_one([5, 17, 42], _body("x")["sampling_params"], "call-0-0")
            )
            for _ in range(1200):  # the retry is sent under a fresh rid (and queued)
                if client.live_rids.get("call-0-0") == "call-0-0-retry1":
                    break
                await asyncio.sleep(0.05)
            assert client.live_rids["call-0-0"] == "call-0-0-retry1"
            engine.gate.set()
            return await task, client.metrics
        finally:
            await client.close()

    completion, metrics = asyncio.run(run())
    t.join(60)
    assert first["a"][0] == 200
    assert completion.finish_reason != "abort" and len(completion.token_ids) >= 1
    assert metrics["duplicate_rid"] == 1 and metrics["retries"] >= 1 and metrics["failed"] == 0
