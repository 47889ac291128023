"""The SGLang path where it differs from a naive stand-in: the update lock, seeds, aborts.

Real components: embedded servers (aiohttp on loopback, in threads of this process, ``hf``
engine on a random tiny Qwen2) behind the real sglang-router (a process), and the production
client. The only test-made part is ``SlowLoadEngine``, whose disk load takes 12 s, to stand for
a long weight update (a 70B load from disk takes minutes).

Upstream behaviour copied by the stand-in (sgl-project/sglang): ``/health`` runs a one-token
generation behind ``model_update_lock`` (``entrypoints/http_server.py`` ``health_generate``),
which a weight update holds as writer (``managers/tokenizer_communicator_mixin.py``);
``sampling_seed`` counts only with ``--enable-deterministic-inference``
(``sampling/sampling_batch_info.py``); ``AbortReq.abort_all`` (``managers/io_struct.py``).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from test_sglang import ServerThread

from benchmarks.tiny_model import make_tiny_qwen2
from launch.servers import Fleet, Proc, free_port, http
from megatron_rl.rollout.base import GenRequest, SamplingParams
from megatron_rl.rollout.config import RolloutConfig, SGLangConfig
from megatron_rl.rollout.hf_engine import HFEngine
from megatron_rl.rollout.server import EmbeddedServer
from megatron_rl.rollout.sglang_client import SGLangEngine, to_sampling_params

torch.set_num_threads(1)
LOAD_S = 12.0


class SlowLoadEngine(HFEngine):
    """The hf engine whose ``update_weights_from_disk`` takes ``LOAD_S`` longer."""

    def update_weights_from_disk(self, hf_dir: str) -> float:
        time.sleep(LOAD_S)
        return super().update_weights_from_disk(hf_dir) + LOAD_S


class RecordingEngine(HFEngine):
    """The hf engine, remembering the seeds of the requests it was given."""

    seen: list[int | None]

    def generate(self, requests, need_groups=None):  # type: ignore[no-untyped-def]
        self.seen = [r.params.seed for r in requests]
        return super().generate(requests)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_qwen2(tmp_path_factory.mktemp("faults") / "m", "test", seed=0)


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory):
    """The real sglang-router with the fleet's settings, and no servers of its own."""
    with Fleet(tmp_path_factory.mktemp("router"), "", 0, engine="hf", router_port=free_port(),
               health_timeout_s=60) as fleet:  # fmt: skip
        yield fleet


def _serve(fleet: Fleet, server: EmbeddedServer) -> ServerThread:
    st = ServerThread(server)
    port = int(st.url.rsplit(":", 1)[1])
    fleet.register(Proc(f"s{port}", "server", "127.0.0.1", port, [], ""))
    return st


def _client(url: str, tmp: Path, **sg: Any) -> SGLangEngine:
    sg = SGLangConfig(health_timeout_s=30, retry_backoff_s=0.2, **sg)
    cfg = RolloutConfig(
        engine="sglang", urls=[url], request_timeout_s=60, sync_dir=str(tmp), sglang=sg
    )
    return SGLangEngine(cfg, str(tmp / "no-weights"), seed=1)


def _reqs(k: int, max_tokens: int) -> list[GenRequest]:
    return [
        GenRequest([5 + i, 17, 42], SamplingParams(max_tokens=max_tokens, n=4)) for i in range(k)
    ]


def test_health_waits_for_a_long_update_and_the_next_step_sees_no_503(
    router: Fleet, model: Path, tmp_path: Path
) -> None:
    engine = SlowLoadEngine(RolloutConfig(engine="hf"), str(model), seed=0)
    st = _serve(router, EmbeddedServer(engine, str(model), api_key=None))
    client = _client(str(router.router_url), tmp_path)
    try:
        t0 = time.monotonic()
        sync = threading.Thread(target=client.update_weights_from_disk, args=(str(model),))
        sync.start()
        time.sleep(1.0)  # the load holds the update lock now
        status, _ = http("GET", f"{st.url}/health", timeout=3)
        assert status == 0  # no answer: /health waits behind the update, as SGLang's does
        sync.join(60)
        took = time.monotonic() - t0
        assert took > 10, took  # a sync longer than 10 s ...
        out = client.generate(_reqs(4, 4))  # ... then the next step's generation
        assert all(c.finish_reason != "abort" for g in out for c in g)
        m = client.metrics
        assert m.get("rollout/sglang/retries", 0) == 0 and m.get("rollout/sglang/failed", 0) == 0
        assert all(w.get("is_healthy", True) for w in router.router_workers())
        assert http("GET", f"{st.url}/health", timeout=30)[0] == 200
    finally:
        client.shutdown()
        for w in router.router_workers():
            http("DELETE", f"{router.router_url}/workers/{w['id']}")
        st.close()


def test_aborts_are_one_request_per_worker(router: Fleet, model: Path, tmp_path: Path) -> None:
    servers = [
        EmbeddedServer(
            HFEngine(RolloutConfig(engine="hf"), str(model), seed=s), str(model), api_key=None
        )
        for s in (0, 1)
    ]
    threads = [_serve(router, s) for s in servers]
    client = _client(str(router.router_url), tmp_path, max_concurrency=6)
    try:
        reqs = _reqs(1, 2) + _reqs(6, 48)  # one short group, six long ones
        out = client.generate(reqs, need_groups=1)
        assert out[0][0].finish_reason != "abort"
        aborted = sum(g[0].finish_reason == "abort" for g in out)
        assert aborted >= 1
        assert [s.stats["abort_requests"] for s in servers] == [1, 1]  # not one per request
        assert client.metrics["rollout/sglang/abort_posts"] == 2
        assert all(not s.inflight for s in servers)  # nothing left to hold the next sync
    finally:
        client.shutdown()
        for w in router.router_workers():
            http("DELETE", f"{router.router_url}/workers/{w['id']}")
        for t in threads:
            t.close()


@pytest.mark.parametrize("deterministic", [False, True])
def test_sampling_seed_counts_only_in_deterministic_mode(model: Path, deterministic: bool) -> None:
    engine = RecordingEngine(RolloutConfig(engine="hf"), str(model), seed=0)
    st = ServerThread(EmbeddedServer(engine, str(model), deterministic=deterministic, api_key=None))
    try:
        body = {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 2,
                "sampling_seed": 1234}}  # fmt: skip
        assert http("POST", f"{st.url}/generate", body, timeout=60)[0] == 200
        assert engine.seen == ([1234] if deterministic else [None])  # None: the server's stream
        info = http("GET", f"{st.url}/get_server_info")[1]
        assert f'"enable_deterministic_inference": {str(deterministic).lower()}' in info
    finally:
        st.close()
    req = GenRequest([1], SamplingParams())
    assert "sampling_seed" not in to_sampling_params(req, None)  # the client's default
