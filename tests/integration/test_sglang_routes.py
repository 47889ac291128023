"""Routed experts over SGLang's HTTP protocol: the production ``sglang`` client against the
embedded server (the CPU stand-in for SGLang; aiohttp on loopback, the hf engine on the shipped
tiny MoE). The wire format is SGLang's (see ``megatron_rl/rollout/sglang_schema.py`` for the
upstream files): ``return_routed_experts: true`` in ``/generate`` (a server started with
``--enable-return-routed-experts``), answered with ``meta_info["routed_experts"]``, base64 of an
int32 ``[prompt + completion - 1, layers, top-k]`` array, as slime decodes it.
"""

from __future__ import annotations

import asyncio
import base64
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from test_sglang import ServerThread

from launch.server_args import sglang_server_args
from megatron_rl.rollout import sglang_schema
from megatron_rl.rollout.base import GenRequest, SamplingParams
from megatron_rl.rollout.config import RolloutConfig, SGLangConfig
from megatron_rl.rollout.hf_engine import HFEngine
from megatron_rl.rollout.server import EmbeddedServer
from megatron_rl.rollout.sglang_client import SGLangEngine

TINY_MOE = Path(__file__).resolve().parents[2] / "models" / "tiny-moe"


@pytest.fixture(scope="module")
def served():
    torch.set_num_threads(1)
    cfg = RolloutConfig(engine="hf", return_routed_experts=True)
    server = EmbeddedServer(HFEngine(cfg, str(TINY_MOE), seed=0), str(TINY_MOE), api_key=None)
    st = ServerThread(server)
    yield st, server
    st.close()


def _post(url: str, body: dict[str, Any]) -> tuple[int, Any]:
    async def call() -> tuple[int, Any]:
        import aiohttp

        async with aiohttp.ClientSession() as s:
            async with s.post(f"{url}/generate", json=body) as r:
                return r.status, await r.json()

    return asyncio.run(call())


def test_client_receives_the_servers_routed_experts(served, tmp_path: Path) -> None:
    st, server = served
    model = tmp_path / "engine_weights"  # as the RL loop hands it: config.json + weights
    shutil.copytree(TINY_MOE, model)
    cfg = RolloutConfig(engine="sglang", urls=[st.url], return_routed_experts=True,
                        sync_dir=str(tmp_path / "sync"), request_timeout_s=60,
                        sglang=SGLangConfig(health_timeout_s=10))  # fmt: skip
    client = SGLangEngine(cfg, str(model), seed=7)
    try:
        reqs = [GenRequest([5 + i, 17, 42, 9], SamplingParams(max_tokens=8, n=2, seed=i))
                for i in range(3)]  # fmt: skip
        got = client.generate(reqs)
    finally:
        client.shutdown()
    for req, group in zip(reqs, got, strict=True):
        for c in group:
            assert c.routed_experts is not None
            assert c.routed_experts.shape == (len(req.prompt_ids) + len(c.token_ids) - 1, 4, 2)
            assert c.routed_experts.dtype == torch.int32
            # the server's engine, asked directly for the same sample, chose the same experts
            again = server.engine.generate([GenRequest(req.prompt_ids + c.token_ids[:-1],
                                                       SamplingParams(max_tokens=1))])  # fmt: skip
            prefix = again[0][0].routed_experts  # routes of every token the engine ran
            assert torch.equal(prefix.sort(-1).values, c.routed_experts.sort(-1).values)


def test_wire_format_is_base64_int32(served) -> None:
    st, _ = served
    body = {"rid": "w-1", "input_ids": [3, 4, 5], "return_logprob": True,
            "return_routed_experts": True,
            "sampling_params": {"max_new_tokens": 4, "n": 1, "sampling_seed": 1}}  # fmt: skip
    sglang_schema.validate("generate", body)
    status, out = _post(st.url, body)
    assert status == 200
    meta = out["meta_info"]
    values = np.frombuffer(base64.b64decode(meta["routed_experts"]), dtype=np.int32)
    assert values.size == (3 + meta["completion_tokens"] - 1) * 4 * 2
    assert values.min() >= 0 and values.max() < 8
    status, out = _post(st.url, {**body, "rid": "w-2", "return_routed_experts": False})
    assert status == 200 and "routed_experts" not in out["meta_info"]


def test_server_without_routed_experts_refuses_the_request(tmp_path: Path) -> None:
    server = EmbeddedServer(
        HFEngine(RolloutConfig(engine="hf"), str(TINY_MOE), 0), str(TINY_MOE), api_key=None
    )
    st = ServerThread(server)
    try:
        body = {"input_ids": [3, 4], "return_routed_experts": True,
                "sampling_params": {"max_new_tokens": 2}}  # fmt: skip
        status, out = _post(st.url, body)
    finally:
        st.close()
    assert status == 400 and "return_routed_experts" in str(out)


def test_sglang_servers_are_started_with_routed_experts_for_replay() -> None:
    rollout = RolloutConfig()
    assert "--enable-return-routed-experts" in sglang_server_args(rollout, routed_experts=True)
    assert "--enable-return-routed-experts" not in sglang_server_args(rollout)
