"""The checks of ``make gpu-check`` (run by ``gpu_check.py``, which says what each one checks):
a registry (``@check(name, needs=..., gpus=...)``) and what the checks share (``Ctx``: the
device, a tiny model on disk, a scratch folder; the transformers reference log-probs).

Standard library only at import: the checks import what they need when they run, after
``gpu_check.py`` has put the carried wheels on the path.
"""

from __future__ import annotations

import argparse
import functools
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class Check:
    name: str
    fn: Callable[[Any], dict[str, Any]]  # (context) -> figures, with "ok"
    needs: tuple[str, ...]  # modules that must import
    gpus: int  # GPUs it needs (0: runs on --device cpu too)


CHECKS: dict[str, Check] = {}


def check(name: str, needs: tuple[str, ...] = (), gpus: int = 1) -> Callable[..., Any]:
    def add(fn: Callable[[Any], dict[str, Any]]) -> Callable[[Any], dict[str, Any]]:
        CHECKS[name] = Check(name, fn, needs, gpus)
        return fn

    return add


class Ctx:
    """What the checks share: the device, a tiny model on disk, a scratch folder."""

    def __init__(self, device: str) -> None:
        import torch

        from benchmarks.tiny_model import make_tiny_qwen2

        self.device = device
        self.tmp = Path(tempfile.mkdtemp(prefix="gpu-check-"))
        self.model = make_tiny_qwen2(self.tmp / "model", "3m", seed=0)
        self.gpus = torch.cuda.device_count() if device == "cuda" else 0


@functools.cache
def _hf_model(model_dir: Path, device: str) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    net = AutoModelForCausalLM.from_pretrained(str(model_dir), torch_dtype=torch.float32)
    return net.to(device).eval()


def hf_logprobs(model_dir: Path, device: str, prompt: list[int], tokens: list[int]) -> Any:
    """log p(token | prefix) at temperature 1 from a plain transformers forward (fp32)."""
    import torch

    net = _hf_model(model_dir, device)
    with torch.no_grad():
        logits = net(torch.tensor([prompt + tokens], device=device)).logits[0].float()
    lp = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)
    return lp[torch.arange(len(tokens)), torch.tensor(tokens, device=device)].cpu()


def _worst(model_dir: Path, device: str, reqs: list[Any], outs: list[Any]) -> float:
    import torch

    worst = 0.0
    for r, group in zip(reqs, outs, strict=True):
        for c in group:
            ref = hf_logprobs(model_dir, device, r.prompt_ids, c.token_ids)
            worst = max(worst, float((ref - torch.tensor(c.logprobs)).abs().max()))
    return worst


def _requests(k: int = 4) -> list[Any]:
    from megatron_rl.rollout.base import GenRequest, SamplingParams

    return [
        GenRequest([5 + i, 17, 42, 99], SamplingParams(max_tokens=12, n=2, seed=i))
        for i in range(k)
    ]


@check("device", needs=("torch",), gpus=1)
def device_check(ctx: Ctx) -> dict[str, Any]:
    import torch

    a = torch.randn(2048, 2048, device="cuda")
    err = float((a.bfloat16() @ a.bfloat16()).float().sub(a @ a).abs().max() / (a @ a).abs().max())
    cap = torch.cuda.get_device_capability()
    return {"gpu": torch.cuda.get_device_name(), "capability": f"{cap[0]}.{cap[1]}",
            "gpus": ctx.gpus, "torch": torch.__version__, "bf16_rel_err": err,
            "ok": err < 2e-2}  # fmt: skip


@check("hf_engine", needs=("transformers",), gpus=0)
def hf_engine_check(ctx: Ctx) -> dict[str, Any]:
    from megatron_rl.rollout.config import RolloutConfig
    from megatron_rl.rollout.hf_engine import HFEngine

    engine = HFEngine(RolloutConfig(engine="hf"), str(ctx.model), seed=0)
    reqs = _requests()
    t0 = time.perf_counter()
    outs = engine.generate(reqs)
    worst = _worst(ctx.model, ctx.device, reqs, outs)
    return {"engine_device": str(engine.device), "generate_s": time.perf_counter() - t0,
            "logp_abs_max": worst, "ok": worst < 1e-3}  # fmt: skip


@check("weight_update", needs=("transformers", "aiohttp", "jsonschema"), gpus=0)
def weight_update_check(ctx: Ctx) -> dict[str, Any]:
    """Disk and tensor weight updates through the real server and client (no router)."""
    import asyncio
    import threading

    import torch
    from aiohttp import web

    from megatron_rl.model import hf_io
    from megatron_rl.rollout.base import load_hf_dir
    from megatron_rl.rollout.config import RolloutConfig, SGLangConfig
    from megatron_rl.rollout.hf_engine import HFEngine
    from megatron_rl.rollout.server import EmbeddedServer
    from megatron_rl.rollout.sglang_client import SGLangEngine

    server = EmbeddedServer(HFEngine(RolloutConfig(engine="hf"), str(ctx.model), seed=0),
                            str(ctx.model), deterministic=True, api_key=None)  # fmt: skip
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    runner = web.AppRunner(server.app(), access_log=None)
    asyncio.run_coroutine_threadsafe(runner.setup(), loop).result()
    asyncio.run_coroutine_threadsafe(web.TCPSite(runner, "127.0.0.1", 0).start(), loop).result()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    cfg = RolloutConfig(engine="sglang", urls=[url], sync_dir=str(ctx.tmp / "sync"),
                        sglang=SGLangConfig(deterministic=True))  # fmt: skip
    client = SGLangEngine(cfg, str(ctx.tmp / "none"), seed=0)
    out: dict[str, Any] = {}
    try:
        g = torch.Generator().manual_seed(1)
        base = load_hf_dir(str(ctx.model), "gpu-check")
        for how in ("disk", "tensors"):
            sd = {k: v + 0.02 * torch.randn(v.shape, generator=g) for k, v in base.items()}
            new = ctx.tmp / f"new-{how}"
            hf_io.save_hf(new, sd, hf_io.load_hf_config(str(ctx.model))[1],
                          tokenizer_from=str(ctx.model), overwrite=True)  # fmt: skip
            t0 = time.perf_counter()
            client.update_weights_from_disk(str(new)) if how == "disk" else client.update_weights(
                sd
            )
            out[f"{how}_update_s"] = time.perf_counter() - t0
            reqs = _requests()
            out[f"{how}_logp_abs_max"] = _worst(new, ctx.device, reqs, client.generate(reqs))
    finally:
        client.shutdown()
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result()
        loop.call_soon_threadsafe(loop.stop)
    out["ok"] = out["disk_logp_abs_max"] < 1e-3 and out["tensors_logp_abs_max"] < 1e-3
    return out


@check("megatron_policy", needs=("megatron.core", "transformers"), gpus=0)
def megatron_policy_check(ctx: Ctx) -> dict[str, Any]:
    import torch

    from megatron_rl.config.train import TrainConfig
    from megatron_rl.model import hf_io
    from megatron_rl.model.config import ParallelConfig
    from megatron_rl.model.parallel import init_distributed
    from megatron_rl.model.policy import Policy
    from megatron_rl.packing.batch import pack

    _, cfg = hf_io.load_hf_config(str(ctx.model))
    dist = init_distributed(ParallelConfig(), 0)
    pol = Policy(cfg, dist, TrainConfig())
    sd, _ = hf_io.load_hf(str(ctx.model))
    pol.load_hf_state_dict(sd)
    seqs = [[(7 * i + j) % 300 for j in range(n)] for i, n in enumerate([37, 64, 5, 90])]
    batch = pack(seqs, [[1.0] * len(s) for s in seqs])
    ((lp, _),) = pol.token_logprobs([batch])
    mine = torch.split(lp.float().cpu(), [len(s) for s in seqs])
    worst = max(float((m[1:] - hf_logprobs(ctx.model, ctx.device, s[:1], s[1:])).abs().max())
                for m, s in zip(mine, seqs, strict=True))  # fmt: skip
    return {"policy_vs_hf_logp_abs_max": worst, "ok": worst < 1e-3}


@check("mfu", needs=("megatron.core",), gpus=1)
def mfu_check(ctx: Ctx) -> dict[str, Any]:
    from benchmarks.gpu_mfu import train_mfu

    args = argparse.Namespace(steps=3, seqs=32, seq_len=1024, micro_batch_tokens=8192)
    r = train_mfu(args)
    mfu = r["achieved_flops"] / 989e12  # H100/H200 SXM dense bf16 datasheet peak
    return {"mfu": mfu, "params": r["params"], "step_s": r["step_s"], "ok": mfu > 0}


LENS = [37, 128, 5, 90]


def _policy(model_dir: Path, te: bool, train: Any = None) -> Any:
    """A bf16 policy on the TE or megatron-core's local layer spec, with ``model_dir``'s weights."""
    import dataclasses

    from megatron_rl.model import gpt, hf_io, parallel, policy
    from megatron_rl.model.config import ParallelConfig
    from megatron_rl.model.parallel import init_distributed

    _, hf_cfg = hf_io.load_hf_config(str(model_dir))
    cfg = dataclasses.replace(hf_cfg, dtype="bfloat16")
    dist = init_distributed(ParallelConfig(), 0)
    real = parallel.use_te_spec
    users = (gpt, policy, parallel)  # parallel: what moe.use_grouped_gemm asks at call time
    for m in users:
        m.use_te_spec = (lambda: True) if te else (lambda: False)  # type: ignore[attr-defined]
    try:
        pol = policy.Policy(cfg, dist, train)
    finally:
        for m in users:
            m.use_te_spec = real  # type: ignore[attr-defined]
    sd, _ = hf_io.load_hf(str(model_dir))
    pol.load_hf_state_dict(sd)
    return pol


def _logprobs(pol: Any, seqs: list[list[int]]) -> list[Any]:
    import torch

    from megatron_rl.packing.batch import pack

    batch = pack(seqs, [[1.0] * len(s) for s in seqs])
    ((lp, _),) = pol.token_logprobs([batch])
    return list(torch.split(lp, [len(s) for s in seqs]))


@check("te_vs_local", needs=("transformer_engine", "megatron.core"), gpus=1)
def te_check(ctx: Ctx) -> dict[str, Any]:
    """Per-token log-probs of a packed THD batch: TE layer spec vs megatron-core's local spec."""
    import random

    rng = random.Random(0)
    seqs = [[rng.randrange(300) for _ in range(n)] for n in LENS]
    te = _logprobs(_policy(ctx.model, te=True), seqs)
    local = _logprobs(_policy(ctx.model, te=False), seqs)
    diff = max(float((a[1:] - b[1:]).abs().max()) for a, b in zip(te, local, strict=True))
    return {"te_vs_local_logp_abs_max": diff, "ok": diff < 0.05}


@check("moe_te", needs=("transformer_engine", "megatron.core"), gpus=1)
def moe_te_check(ctx: Ctx) -> dict[str, Any]:
    """A tiny bf16 Qwen3-MoE on the TE spec (alltoall dispatcher, TE grouped GEMM experts) vs
    the local spec (SequentialMLP); the HF export of the TE model equals the weights it loaded;
    replaying the routes of a free forward gives the same log-probs; one training step
    (grouped-GEMM backward) has a finite grad norm. EP > 1 needs more than one GPU."""
    import math
    import random
    from dataclasses import replace

    import torch

    from benchmarks.tiny_model import make_tiny_qwen3
    from megatron_rl.config.train import TrainConfig
    from megatron_rl.model import hf_io
    from megatron_rl.model.moe import ROUTES_KEY, routes_extra
    from megatron_rl.packing.batch import pack

    model = make_tiny_qwen3(ctx.tmp / "moe", "test", seed=0, moe=True)
    rng = random.Random(1)
    seqs = [[rng.randrange(300) for _ in range(n)] for n in LENS]
    local = _logprobs(_policy(model, te=False), seqs)
    pol = _policy(model, te=True)
    te = _logprobs(pol, seqs)
    diff = max(float((a[1:] - b[1:]).abs().max()) for a, b in zip(te, local, strict=True))
    sd, _ = hf_io.load_hf(str(model))
    back = pol.hf_state_dict()
    export_exact = back.keys() == sd.keys() and all(
        torch.equal(back[k].cpu(), sd[k].to(back[k].dtype)) for k in sd
    )
    batch = pack(seqs, [[1.0] * len(q) for q in seqs])
    pol.replay.record()
    ((free, _),) = pol.token_logprobs([batch])
    routes = pol.replay.recorded().cpu()
    pol.replay.record(False)
    replayed_batch = replace(batch, extras={ROUTES_KEY: routes_extra(routes)})
    ((replayed, _),) = pol.token_logprobs([replayed_batch])
    replay_diff = float((free - replayed).abs().max())
    trainer = _policy(model, te=True, train=TrainConfig(lr=1e-4))
    trainer.forward_backward([batch], lambda b, lp, ent: (-(lp * b.loss_mask).mean(), {}))
    grad_norm = trainer.optimizer_step(1e-4)["grad_norm"]
    ok = diff < 0.05 and export_exact and replay_diff == 0.0 and math.isfinite(grad_norm)
    return {"te_vs_local_logp_abs_max": diff, "export_exact": export_exact,
            "replay_logp_abs_max": replay_diff, "grad_norm": grad_norm, "ok": ok}  # fmt: skip


@check("sglang_update", needs=("sglang", "sglang_router"), gpus=1)
def sglang_check(ctx: Ctx) -> dict[str, Any]:
    raise NotImplementedError("write it when a GPU with SGLang is lent")


@check("nccl_weight_group", needs=("torch",), gpus=2)
def nccl_group_check(ctx: Ctx) -> dict[str, Any]:
    raise NotImplementedError("needs 2 GPUs: trainer rank 0 and one server rank")
