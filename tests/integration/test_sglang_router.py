"""Two embedded servers behind the real sglang-router; one is killed mid-step.

Real processes throughout: ``megatron-rl serve --engine hf`` servers, ``sglang_router``, and
:class:`launch.servers.Fleet` supervising them. The run must finish with every sample present
exactly once (same tokens as an undisturbed run with the same seeds), the client's metrics must
show the retried requests, and the restarted server must rejoin with the current weights.
"""

from __future__ import annotations

import json
import signal
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import auth_headers

from benchmarks.tiny_model import make_tiny_qwen2
from launch.servers import Fleet, assign_gpus, free_port
from megatron_rl.rollout.base import GenRequest, SamplingParams
from megatron_rl.rollout.config import RolloutConfig, SGLangConfig
from megatron_rl.rollout.sglang_client import SGLangEngine


def _get(url: str) -> dict:
    with urllib.request.urlopen(
        urllib.request.Request(url, headers=auth_headers()), timeout=10
    ) as r:
        return json.loads(r.read())


def test_killing_a_server_mid_step_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    model_a = make_tiny_qwen2(tmp_path / "a", seed=0)
    model_b = make_tiny_qwen2(tmp_path / "b", seed=1)
    fleet = Fleet(
        tmp_path / "run", str(model_a), 2, engine="hf", router_port=free_port(),
        health_timeout_s=180, server_args=["--enable-deterministic-inference"],
    )  # fmt: skip
    with fleet:
        cfg = RolloutConfig(
            engine="sglang",
            urls=[str(fleet.router_url)],
            sync_dir=str(fleet.sync_dir),
            request_timeout_s=120,
            sglang=SGLangConfig(
                max_concurrency=8, retry_backoff_s=0.1, max_retries=10, deterministic=True
            ),
        )
        client = SGLangEngine(cfg, str(tmp_path), seed=3)
        try:
            client.update_weights_from_disk(str(model_b))  # weights "1" on both servers
            reqs = [
                GenRequest([7 + i, 40, 41], SamplingParams(max_tokens=12, n=4, seed=10 + i))
                for i in range(6)
            ]
            result: list = []
            worker = threading.Thread(target=lambda: result.append(client.generate(reqs)))
            worker.start()
            # Kill server 0 once it has answered a request: with 24 samples and at most 8 in
            # flight, requests are then still running or queued for it.
            url0 = fleet.servers[0].url
            while _get(f"{url0}/get_server_info")["stats"]["requests"] < 1:
                assert worker.is_alive(), "the step finished before the kill"
                time.sleep(0.05)
            killed = fleet.kill_server(0, signal.SIGKILL)
            worker.join(timeout=300)
            assert not worker.is_alive()
            disturbed = result[0]
            metrics = client.metrics

            restarted = fleet.check()  # supervisor pass: restart, load weights "1", re-add
            assert restarted == [fleet.servers[0].name]
            assert fleet.servers[0].pid != killed
            info = _get(f"{fleet.servers[0].url}/get_server_info")
            assert info["weight_version"] == "1"
            assert len(fleet.router_workers()) == 2

            calm = client.generate(reqs)  # same seeds: the reference outcome
        finally:
            client.shutdown()

    assert metrics["rollout/sglang/retries"] >= 1, metrics
    assert metrics.get("rollout/sglang/failed", 0) == 0
    assert metrics["rollout/sglang/requests"] == 24 + metrics["rollout/sglang/retries"]
    assert [len(g) for g in disturbed] == [4] * 6
    for g_dist, g_calm in zip(disturbed, calm, strict=True):
        for a, b in zip(g_dist, g_calm, strict=True):
            assert a.finish_reason != "abort" and len(a.token_ids) == len(a.logprobs) > 0
            assert a.token_ids == b.token_ids  # the same sample, once, from the current weights
    manifest = json.loads((tmp_path / "run").glob("servers-*.json").__next__().read_text())
    roles = [p["role"] for p in manifest["processes"]]
    assert roles == ["router", "server", "server"]
    assert manifest["processes"][1]["restarts"] == 1


def test_server_that_never_becomes_healthy_fails_in_bounded_time(tmp_path: Path) -> None:
    class SleepyFleet(Fleet):
        def server_cmd(self, p):  # a process that runs but never answers /health
            return ["sleep", "60"]

    fleet = SleepyFleet(tmp_path, str(tmp_path), 1, engine="hf", health_timeout_s=3)
    t0 = time.monotonic()
    with pytest.raises(ValueError, match=r"server-.*-0 at http://.* was not healthy after 3 s"):
        with fleet:
            pass
    assert time.monotonic() - t0 < 20
    assert not fleet._popen  # stopped on the way out


def test_server_that_crashes_at_start_is_reported_with_its_log(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path, str(tmp_path / "no-such-model"), 1, engine="hf", health_timeout_s=120)
    with pytest.raises(ValueError, match="exited with code"):
        with fleet:
            pass


def test_more_gpus_than_the_allocation_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    assert assign_gpus(2, 2) == [["0", "1"], ["2", "3"]]
    with pytest.raises(ValueError, match="3 servers x 2 GPUs = 6 GPUs requested.*has 4"):
        assign_gpus(3, 2)
