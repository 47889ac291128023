"""Rollout routing replay on CPU: the train/inference log-prob mismatch with and without replay.

    python -m benchmarks.studies.routing_replay [--model models/tiny-moe] [--prompts 16] \
        [--json OUT]

The hf engine samples from the tiny MoE (``n=4`` per prompt, 24 new tokens, T=1) and returns
the experts it chose; the trainer (the fp32 Megatron policy, local spec) scores the same tokens
twice on one batch, replaying those experts and routing freely. Three engine set-ups, each one
run beside the others on the same prompts:

* ``fp32``: the engine in fp32 (control: the same routing as the trainer);
* ``bf16_router``: the engine in fp32 but its router's logits in bf16, as a bf16 serving engine
  computes them (the trainer's router stays fp32): routing differs, little else;
* ``bf16``: the whole engine in bf16: routing differs and so does everything else.

Per set-up it prints the mean and max per-token |logp_trainer - logp_engine| over sampled tokens
with and without replay, their ratio, and the share of (token, layer) choices on which the
engine and the trainer agree.
"""

from __future__ import annotations

import argparse
import json
import types
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F


def bf16_router(gate: torch.nn.Module) -> None:
    """HF Qwen3-MoE's router with its logits computed in bf16."""

    def forward(self: Any, hidden_states: torch.Tensor) -> tuple[torch.Tensor, ...]:
        h = hidden_states.reshape(-1, self.hidden_dim)
        logits = F.linear(h.bfloat16(), self.weight.bfloat16()).float()
        top, idx = torch.topk(torch.softmax(logits, dim=-1), self.top_k, dim=-1)
        if self.norm_topk_prob:
            top = top / top.sum(dim=-1, keepdim=True)
        return logits, top, idx

    gate.forward = types.MethodType(forward, gate)  # type: ignore[method-assign]


def pack_rollout(reqs: list[Any], outs: list[list[Any]]) -> Any:
    """Prompt + completion of every sample packed with the engine's log-probs and routes."""
    from megatron_rl.controller.batches import sample_routes
    from megatron_rl.model.moe import ROUTES_KEY
    from megatron_rl.packing.batch import pack
    from megatron_rl.rollout.groups import Sample

    seqs, masks, lps, routes = [], [], [], []
    for req, group in zip(reqs, outs, strict=True):
        for c in group:
            p = len(req.prompt_ids)
            s = Sample("d", req.prompt_ids, c.token_ids, c.logprobs, [1.0] * len(c.token_ids),
                       c.text, c.finish_reason, routed_experts=c.routed_experts)  # fmt: skip
            seqs.append(req.prompt_ids + c.token_ids)
            masks.append([0.0] * p + [1.0] * len(c.token_ids))
            lps.append([0.0] * p + c.logprobs)
            routes.append(sample_routes(s))
    return pack(seqs, masks, extras={"rollout_lp": lps, ROUTES_KEY: routes})


def rollout(model: str, setup: str, prompts: int) -> Any:
    """One packed batch of the engine's samples, its log-probs and its routes."""
    from megatron_rl.rollout.base import GenRequest, SamplingParams
    from megatron_rl.rollout.config import RolloutConfig
    from megatron_rl.rollout.hf_engine import HFEngine

    dtype = "bfloat16" if setup == "bf16" else "float32"
    cfg = RolloutConfig(return_routed_experts=True, max_batch=64, dtype=dtype)
    eng = HFEngine(cfg, model, seed=0)
    if setup == "bf16_router":
        for layer in eng.model.model.layers:
            bf16_router(layer.mlp.gate)
    g = torch.Generator().manual_seed(0)
    reqs = [GenRequest(torch.randint(0, 256, (12,), generator=g).tolist(),
                       SamplingParams(n=4, max_tokens=24, temperature=1.0, seed=i))
            for i in range(prompts)]  # fmt: skip
    return pack_rollout(reqs, eng.generate(reqs))


def measure(policy: Any, batch: Any) -> dict[str, float]:
    """Per-token |logp_trainer - logp_engine| on the sampled tokens with and without replay
    (mean, max, their ratio), and the share of (token, layer) choices trainer and engine share."""
    from megatron_rl.model.moe import ROUTES_KEY

    policy.replay.record()
    ((free, _),) = policy.token_logprobs([replace(batch, extras={"rollout_lp": batch.extras[
        "rollout_lp"]})])  # fmt: skip
    own = policy.replay.recorded()
    policy.replay.record(False)
    ((replayed, _),) = policy.token_logprobs([batch])
    from megatron_rl.losses import logp_mismatch

    out: dict[str, float] = {"tokens": float(batch.loss_mask.sum())}
    for name, lp in (("replay", replayed), ("free", free)):
        mm = logp_mismatch(lp, batch.extras["rollout_lp"], batch.loss_mask)
        out[f"{name}_mean"], out[f"{name}_max"] = mm.mean, mm.max
    out["ratio_mean"] = out["free_mean"] / max(out["replay_mean"], 1e-12)
    k = policy.cfg.moe.topk
    eng = batch.extras[ROUTES_KEY].view(own.shape[0], -1, k).long()
    same = (own.sort(-1).values == eng.sort(-1).values).all(-1)
    ran = torch.ones(len(same), dtype=torch.bool)
    ran[batch.cu_seqlens[1:].long() - 1] = False  # last tokens carry placeholders
    out["agreement"] = float(same[ran].float().mean())
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="models/tiny-moe")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--json", default=None)
    a = p.parse_args()
    torch.set_num_threads(1)
    from megatron_rl.model import hf_io
    from megatron_rl.model.config import ParallelConfig
    from megatron_rl.model.parallel import init_distributed
    from megatron_rl.model.policy import Policy

    sd, cfg = hf_io.load_hf(a.model)
    policy = Policy(cfg, init_distributed(ParallelConfig(), seed=0))
    policy.load_hf_state_dict(sd)
    results = {s: measure(policy, rollout(a.model, s, a.prompts))
               for s in ("fp32", "bf16_router", "bf16")}  # fmt: skip
    print(json.dumps(results, indent=2))
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
