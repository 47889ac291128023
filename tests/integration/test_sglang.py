"""SGLang client <-> embedded server: schemas, values, abort, weights, bad input.

Everything is real: the embedded server (aiohttp on loopback, in a thread of this process) runs
the ``hf`` engine on a random tiny Qwen2, and the client is the production ``sglang`` engine.
The only stand-ins are in the NCCL weight-sync test (no GPU here): the broadcast and the HTTP
POSTs are recorded instead of sent, and that test says so.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
import torch
from aiohttp import web

from benchmarks.tiny_model import make_tiny_qwen2
from megatron_rl.rollout import sglang_schema
from megatron_rl.rollout.base import GenRequest, SamplingParams, derive_seed
from megatron_rl.rollout.config import RolloutConfig, SGLangConfig
from megatron_rl.rollout.hf_engine import HFEngine
from megatron_rl.rollout.server import EmbeddedServer
from megatron_rl.rollout.sglang_client import (
    DistributedWeightSync,
    SGLangEngine,
    to_sampling_params,
)

torch.set_num_threads(1)


class ServerThread:
    """An EmbeddedServer on 127.0.0.1:<free port>, served from a background event loop."""

    def __init__(self, server: EmbeddedServer) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.runner = web.AppRunner(server.app(), access_log=None)
        asyncio.run_coroutine_threadsafe(self.runner.setup(), self.loop).result()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        asyncio.run_coroutine_threadsafe(site.start(), self.loop).result()
        port = self.runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("models")
    return make_tiny_qwen2(root / "a", seed=0), make_tiny_qwen2(root / "b", seed=1)


@pytest.fixture(scope="module")
def served(models: tuple[Path, Path]):
    cfg = RolloutConfig(engine="hf", max_new_tokens=8)
    # deterministic: sampling_seed counts (SGLang's --enable-deterministic-inference)
    server = EmbeddedServer(
        HFEngine(cfg, str(models[0]), seed=0), str(models[0]), deterministic=True, api_key=None
    )
    st = ServerThread(server)
    yield st, server
    st.close()


def _client(url: str, tmp: Path, **sg: Any) -> SGLangEngine:
    cfg = RolloutConfig(
        engine="sglang",
        urls=[url],
        request_timeout_s=60,
        sync_dir=str(tmp / "sync"),
        sglang=SGLangConfig(health_timeout_s=10, retry_backoff_s=0.05, deterministic=True, **sg),
    )
    return SGLangEngine(cfg, str(tmp), seed=7)


def _requests(k: int, n: int, max_tokens: int = 6, seed0: int = 100) -> list[GenRequest]:
    return [
        GenRequest([5 + i, 17, 42], SamplingParams(max_tokens=max_tokens, n=n, seed=seed0 + i))
        for i in range(k)
    ]


def _one(prompt: list[int], seed: int) -> GenRequest:
    return GenRequest(prompt, SamplingParams(max_tokens=6, seed=seed))


def test_client_requests_and_server_responses_follow_sglang_schemas(served, models, tmp_path):
    st, _ = served
    req = _requests(1, 1)[0]
    body = {
        "rid": "r-0",
        "input_ids": req.prompt_ids,
        "sampling_params": to_sampling_params(req, 3),
        "return_logprob": True,
    }
    sglang_schema.validate("generate", body)
    # What sglang-router 0.3.2 adds when it forwards a request is accepted too.
    sglang_schema.validate("generate", body | {"model": None, "stream": False, "no_logs": False})
    with pytest.raises(ValueError, match="sampling_params"):
        sglang_schema.validate("generate", body | {"sampling_params": {"max_tokens": 4}})
    with pytest.raises(ValueError, match="input_ids"):
        sglang_schema.validate("generate", body | {"input_ids": ["a"]})

    sp = {"n": 3, "max_new_tokens": 5, "sampling_seed": 1}

    async def call() -> tuple[int, Any]:
        import aiohttp

        async with aiohttp.ClientSession() as s:
            async with s.post(f"{st.url}/generate", json=body | {"sampling_params": sp}) as r:
                return r.status, await r.json()

    status, out = asyncio.run(call())
    assert status == 200
    sglang_schema.validate("generate.response", out)
    assert len(out) == 3
    for o in out:
        meta = o["meta_info"]
        assert (
            len(meta["output_token_logprobs"]) == len(o["output_ids"]) == meta["completion_tokens"]
        )
        assert [t[1] for t in meta["output_token_logprobs"]] == o["output_ids"]


def test_generate_matches_the_engine_it_serves(served, models, tmp_path):
    _, server = served
    client = _client(served[0].url, tmp_path)
    try:
        reqs = _requests(3, 2)
        got = client.generate(reqs)
    finally:
        client.shutdown()
    # The client sends each sample as its own request with seed derive_seed(seed_i, 0, j).
    flat = [
        GenRequest(
            r.prompt_ids, SamplingParams(max_tokens=6, seed=derive_seed(r.params.seed, 0, j))
        )
        for r in reqs
        for j in range(2)
    ]
    want = server.engine.generate(flat)
    for i, group in enumerate(got):
        assert len(group) == 2
        for j, c in enumerate(group):
            ref = want[2 * i + j][0]
            assert c.token_ids == ref.token_ids
            assert c.finish_reason == ref.finish_reason == "length"
            assert torch.allclose(torch.tensor(c.logprobs), torch.tensor(ref.logprobs), atol=1e-4)
            assert all(lp <= 0 for lp in c.logprobs)
    m = client.metrics
    assert m["rollout/sglang/requests"] == 6 and m.get("rollout/sglang/retries", 0) == 0


def test_need_groups_returns_early_and_aborts_the_rest(served, tmp_path):
    client = _client(served[0].url, tmp_path, max_concurrency=2)
    try:
        reqs = _requests(1, 1, max_tokens=4) + _requests(6, 1, max_tokens=64, seed0=500)
        t0 = time.monotonic()
        out = client.generate(reqs, need_groups=1)
        took = time.monotonic() - t0
    finally:
        client.shutdown()
    done = [g for g in out if g[0].finish_reason != "abort"]
    aborted = [g for g in out if g[0].finish_reason == "abort"]
    assert len(done) >= 1 and len(aborted) >= 1, (took, [g[0].finish_reason for g in out])
    assert all(g[0].token_ids == [] and g[0].logprobs == [] for g in aborted)
    assert client.metrics["rollout/sglang/aborted"] == len(aborted)


def test_update_weights_from_disk_changes_logprobs_and_is_recorded(models, tmp_path):
    cfg = RolloutConfig(engine="hf", max_new_tokens=8)
    engine = HFEngine(cfg, str(models[0]), seed=0)
    st = ServerThread(EmbeddedServer(engine, str(models[0]), deterministic=True, api_key=None))
    client = _client(st.url, tmp_path)
    try:
        req = _requests(1, 1)
        before = client.generate(req)[0][0]
        secs = client.update_weights_from_disk(str(models[1]))
        after = client.generate(req)[0][0]
        ref = HFEngine(cfg, str(models[1]), seed=0)
        flat = [
            GenRequest(req[0].prompt_ids, SamplingParams(max_tokens=6, seed=derive_seed(100, 0, 0)))
        ]
        want = ref.generate(flat)[0][0]
    finally:
        client.shutdown()
        st.close()
    assert secs > 0
    assert after.token_ids == want.token_ids and before.logprobs != after.logprobs
    record = json.loads((tmp_path / "sync" / "current_weights.json").read_text())
    assert record == {"path": str(models[1].resolve()), "version": "1"}


def test_unreachable_router_fails_clearly_in_bounded_time(tmp_path):
    t0 = time.monotonic()
    with pytest.raises(ValueError, match="not healthy after 2 s"):
        cfg = RolloutConfig(
            engine="sglang", urls=["http://127.0.0.1:9"], sglang=SGLangConfig(health_timeout_s=2)
        )
        SGLangEngine(cfg, str(tmp_path), seed=0)
    assert time.monotonic() - t0 < 10


def test_bad_requests_are_rejected_with_the_field_named(served):
    import urllib.request

    def post(body: dict[str, Any]) -> tuple[int, str]:
        req = urllib.request.Request(
            f"{served[0].url}/generate", data=json.dumps(body).encode(), method="POST"
        )
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    assert post({"input_ids": [1, 2], "sampling_params": {"top_k": 5}})[0] == 400
    status, text = post({"input_ids": [1, 2], "bogus": 1})
    assert status == 400 and "bogus" in text
    status, text = post({"text": "hello", "input_ids": [1]})  # SGLang: exactly one of them
    assert status == 400 and "text" in text
    status, text = post({"text": "hello", "sampling_params": {"max_new_tokens": 3}})
    assert status == 200 and "text" in json.loads(text)  # tokenised with the model's tokenizer


def test_distributed_weight_sync_request_side(monkeypatch: pytest.MonkeyPatch):
    """Request side only: POSTs are recorded and the broadcast is a stand-in that checks the
    order; what is checked is ranks, world size, bucket contents and ordering. The real group
    and broadcast over gloo are tests/integration/test_weight_update.py."""
    posts: list[tuple[str, dict[str, Any]]] = []
    sent: list[torch.Tensor] = []

    def post(url: str, body: dict[str, Any], timeout_s: float | None = None) -> Future[Any]:
        posts.append((url, body))
        f: Future[Any] = Future()
        f.set_result({"success": True, "message": ""})
        return f

    class Group:
        def broadcast(self, tensors: list[torch.Tensor]) -> None:
            assert posts, "the servers must be told what to receive before the broadcast"
            sent.extend(tensors)

    urls = ["http://a:1", "http://b:2"]
    cfg = SGLangConfig(bucket_mb=1, engine_tp=2, master_addr="10.0.0.1")
    sync = DistributedWeightSync(cfg, post, lambda: urls, group=Group())
    state = {
        "w1": torch.zeros(128, 1024),  # 0.5 MiB
        "w2": torch.zeros(128, 1024),  # 0.5 MiB -> fills bucket 1
        "w3": torch.zeros(256, 1024, dtype=torch.bfloat16),  # 0.5 MiB -> bucket 2
    }
    assert sync.world_size == 5
    sync.update(state, "3")
    bodies = [b for u, b in posts if u == "http://a:1/update_weights_from_distributed"]
    assert [b["names"] for b in bodies] == [["w1", "w2"], ["w3"]]
    assert bodies[1]["dtypes"] == ["bfloat16"] and bodies[1]["shapes"] == [[256, 1024]]
    assert [b["flush_cache"] for b in bodies] == [False, True]
    for b in bodies:
        sglang_schema.validate("update_weights_from_distributed", b)
    assert [t.shape for t in sent] == [s.shape for s in state.values()]
    assert len(posts) == 4

    # Group initialisation (before the first update): ranks 1-2 and 3-4 for the two servers;
    # a group that fails to form is retried (group_retries), then the error names the servers.
    class NoGroup(Exception):
        pass

    import megatron_rl.rollout.weight_group as wg

    tries: list[int] = []
    monkeypatch.setattr(wg, "host_store", lambda *a: object())
    monkeypatch.setattr(
        wg, "trainer_group", lambda *a: tries.append(1) or (_ for _ in ()).throw(NoGroup())
    )
    monkeypatch.setattr("time.sleep", lambda s: None)
    sync2 = DistributedWeightSync(
        SGLangConfig(bucket_mb=1, engine_tp=2, master_addr="10.0.0.1", group_retries=2), post,
        lambda: urls,
    )  # fmt: skip
    posts.clear()
    with pytest.raises(RuntimeError, match="after 3 attempts"):
        sync2.update(state, "1")
    assert len(tries) == 3
    inits = [b for u, b in posts if u.endswith("/init_weights_update_group")]
    assert [b["rank_offset"] for b in inits] == [1, 3] * 3
    assert all(b["world_size"] == 5 and b["master_address"] == "10.0.0.1" for b in inits)
    assert len({b["group_name"] for b in inits}) == 3  # each attempt under a new name
    for b in inits:
        sglang_schema.validate("init_weights_update_group", b)
    destroys = [b for u, b in posts if u.endswith("/destroy_weights_update_group")]
    assert len(destroys) == 6  # the servers drop a half-built group before the next attempt
