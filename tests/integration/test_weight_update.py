"""SGLang's distributed weight update, for real over gloo: a trainer process, two embedded
servers (each its own ``megatron-rl serve --engine hf`` process) behind the real sglang-router.

The group is built on both ends as SGLang builds it: ``init_custom_process_group`` in
sgl-project/sglang ``python/sglang/srt/utils`` (``tcp://`` rendezvous, ``PrefixStore(group_name,
store)``, torch's ``_new_process_group_helper``, identity ``pg_group_ranks``), joined per server
as ``model_executor/model_runner.py`` ``init_weights_update_group`` does (rank ``rank_offset +
tp_rank``), received as its ``update_weights_from_distributed`` does (``torch.empty`` per name,
``broadcast(src=0)`` in the order of ``names``); payloads are ``io_struct.py``'s
``InitWeightsUpdateGroupReqInput`` / ``UpdateWeightsFromDistributedReqInput``. The only
difference from the GPU path is the backend: gloo instead of NCCL.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from benchmarks.tiny_model import make_tiny_qwen2
from launch.servers import Fleet, free_port, http
from megatron_rl.rollout import weight_group
from megatron_rl.rollout.base import GenRequest, SamplingParams, load_hf_dir
from megatron_rl.rollout.config import RolloutConfig, SGLangConfig
from megatron_rl.rollout.hf_engine import HFEngine
from megatron_rl.rollout.sglang_client import SGLangEngine

torch.set_num_threads(1)
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_qwen2(tmp_path_factory.mktemp("wu") / "model", "test", seed=0)


@pytest.fixture(scope="module")
def fleet(model: Path, tmp_path_factory: pytest.TempPathFactory):
    run = tmp_path_factory.mktemp("run")
    with Fleet(
        run, str(model), 2, engine="hf", router_port=free_port(), health_timeout_s=240,
        sync_dir=str(run / "sync"),
    ) as f:  # fmt: skip
        yield f


def _engine(fleet: Fleet, model: Path) -> SGLangEngine:
    cfg = RolloutConfig(
        engine="sglang",
        urls=[str(fleet.router_url)],
        sync_mode="memory",
        sync_dir=str(fleet.sync_dir),
        request_timeout_s=120,
        sglang=SGLangConfig(
            weight_sync="distributed", master_port=free_port(), group_timeout_s=120,
            health_timeout_s=60, bucket_mb=1,
        ),
    )  # fmt: skip
    return SGLangEngine(cfg, str(model), seed=0)


def _perturbed(model: Path, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {k: v + 0.05 * torch.randn(v.shape, generator=g) for k, v in load_hf_dir(
        str(model), "test").items()}  # fmt: skip


def _server_weights(url: str, names: list[str]) -> dict[str, torch.Tensor]:
    out = {}
    for name in names:
        status, text = http("POST", f"{url}/get_weights_by_name", {"name": name,
                            "truncate_size": 10**6}, timeout=30)  # fmt: skip
        assert status == 200, text
        out[name] = torch.tensor(json.loads(text))
    return out


def _assert_servers_hold(fleet: Fleet, sd: dict[str, torch.Tensor]) -> None:
    for p in fleet.servers:
        got = _server_weights(p.url, list(sd))
        for name, t in sd.items():
            assert torch.equal(got[name], t.float()), (p.name, name)


def _logprob_mismatch(engine: SGLangEngine, model: Path, sd: dict[str, torch.Tensor]) -> float:
    """Max |server log-prob - local hf engine with ``sd``| over samples spread by the router."""
    reqs = [
        GenRequest([5 + i, 17, 42], SamplingParams(max_tokens=6, n=2, seed=i)) for i in range(4)
    ]
    served = engine.generate(reqs)
    local = HFEngine(RolloutConfig(engine="hf"), str(model), seed=0)
    local.update_weights(sd)
    worst = 0.0
    for req, group in zip(reqs, served, strict=True):
        for c in group:
            assert c.finish_reason != "abort" and c.token_ids
            lp = _score(local.model, req.prompt_ids, c.token_ids)
            worst = max(worst, max(abs(a - b) for a, b in zip(lp, c.logprobs, strict=True)))
    return worst


def _score(net: torch.nn.Module, prompt: list[int], tokens: list[int]) -> list[float]:
    """log p(token | prefix) at temperature 1, one full forward pass."""
    with torch.no_grad():
        logits = net(torch.tensor([prompt + tokens])).logits[0].float()
    lp = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)
    return lp[torch.arange(len(tokens)), torch.tensor(tokens)].tolist()


def test_broadcast_reaches_both_servers_and_a_restarted_server_rejoins(
    fleet: Fleet, model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # torchrun sets this in every worker: rank 0 must still serve the store (weight_group doc).
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    seeds = [json.loads(http("GET", f"{p.url}/get_server_info")[1])["random_seed"]
             for p in fleet.servers]  # fmt: skip
    assert seeds == [p.seed for p in fleet.servers] and len(set(seeds)) == 2  # one each
    engine = _engine(fleet, model)
    try:
        sd1 = _perturbed(model, 1)
        engine.update_weights(sd1)
        _assert_servers_hold(fleet, sd1)
        assert _logprob_mismatch(engine, model, sd1) < 1e-4
        rec = json.loads((fleet.sync_dir / "current_weights.json").read_text())
        assert rec["version"] == str(engine.version)  # recorded in distributed mode too

        old_url = fleet.servers[0].url
        fleet.kill_server(0)
        deadline = time.monotonic() + 60
        while not fleet.check() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert fleet.servers[0].url != old_url and fleet.servers[0].restarts == 1
        _assert_servers_hold(fleet, sd1)  # from disk, before it was re-added to the router

        sd2 = _perturbed(model, 2)
        engine.update_weights(sd2)  # the group is rebuilt with the restarted server in it
        _assert_servers_hold(fleet, sd2)
        assert _logprob_mismatch(engine, model, sd2) < 1e-4
    finally:
        engine.shutdown()


def test_a_server_readded_during_a_broadcast_catches_up_from_disk(
    fleet: Fleet, model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race CI hit: the fleet restarts a server while the trainer broadcasts version v to
    the group it built before; the server loads the version recorded before (v-1) and is
    re-added, outside the group. After recording v the trainer loads v onto it from disk."""
    from megatron_rl.rollout.sglang_weights import DistributedWeightSync

    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    engine = _engine(fleet, model)
    try:
        sd1 = _perturbed(model, 3)
        engine.update_weights(sd1)
        _assert_servers_hold(fleet, sd1)
        real_update = DistributedWeightSync.update

        def update_then_restart(self: DistributedWeightSync, state: Any, version: str) -> float:
            out = real_update(self, state, version)  # v reaches the group's members
            fleet.kill_server(0)  # ... and a server is restarted before v is recorded
            deadline = time.monotonic() + 60
            while not fleet.check() and time.monotonic() < deadline:
                time.sleep(0.2)
            return out

        monkeypatch.setattr(DistributedWeightSync, "update", update_then_restart)
        sd2 = _perturbed(model, 4)
        engine.update_weights(sd2)
        assert fleet.servers[0].restarts >= 1
        engine.versions.join()  # the record (and the catch-up) run in the background
        _assert_servers_hold(fleet, sd2)  # the re-added server too
        assert _logprob_mismatch(engine, model, sd2) < 1e-4
    finally:
        engine.shutdown()


SGLANG_SIDE = textwrap.dedent(
    """
    # SGLang's server side, step by step as in python/sglang/srt/utils init_custom_process_group
    import sys, torch
    from torch.distributed.distributed_c10d import (Backend, PrefixStore,
        _new_process_group_helper, _world, rendezvous)
    port, rank, name = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    store, rank, world = next(rendezvous(f"tcp://127.0.0.1:{port}", rank, 3))
    store = PrefixStore(name, store)
    pg, _ = _new_process_group_helper(world, rank, [], Backend("gloo"), store, group_name=name,
                                      backend_options=None, timeout=store.timeout)
    _world.pg_group_ranks[pg] = {i: i for i in range(world)}
    t = torch.empty(4, 3)
    torch.distributed.broadcast(t, src=0, group=pg)
    print(t.sum().item())
    """
)


def test_trainer_group_meets_sglangs_own_construction(tmp_path: Path) -> None:
    """Rank 0 built by :func:`weight_group.trainer_group` and two ranks built literally as SGLang
    does meet and receive the broadcast; a group name that differs never meets."""
    port = free_port()
    script = tmp_path / "sglang_side.py"
    script.write_text(SGLANG_SIDE)
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(port), str(r), "wu-test"],
            stdout=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for r in (1, 2)
    ]
    store = weight_group.host_store("127.0.0.1", port)
    pg = weight_group.trainer_group(store, 3, "wu-test", "gloo")
    weight_group.broadcast_bucket(pg, [torch.arange(12.0).reshape(4, 3)], "cpu")
    outs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert outs == ["66.0", "66.0"]
    weight_group.destroy(pg)
