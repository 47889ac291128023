"""Shared-prefix test data and checks, used by tests/unit/test_shared_prefix.py and the torchrun
workers in tests/integration/dist/ (which put tests/ on their path)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from megatron_rl.packing.batch import PackedBatch, group_tokens, pack, pack_groups, sample_rows

PROMPTS = [9, 14, 5, 2]  # prompt length per group (2: the smallest prompt that is shared)
SIZES = [4, 3, 4, 2]  # members per group
TEMPS = [1.0, 0.7, 1.3, 1.0]  # each group's sampling temperature (extras["temp"])


def make_groups(vocab: int, seed: int = 0, sizes: list[int] = SIZES) -> dict[str, Any]:
    """Samples of four groups: prompt + response tokens, masks (env tokens 0), extras."""
    rng = random.Random(seed)
    seqs, masks, plens, groups = [], [], [], []
    extras: dict[str, list[list[float]]] = {"adv": [], "temp": [], "rollout_lp": []}
    for p, g, t in zip(PROMPTS, sizes, TEMPS, strict=True):
        prompt = [rng.randrange(vocab) for _ in range(p)]
        groups.append(list(range(len(seqs), len(seqs) + g)))
        for _ in range(g):
            r = rng.randint(1, 12)
            seqs.append(prompt + [rng.randrange(vocab) for _ in range(r)])
            masks.append([0.0] * p + [float(rng.random() > 0.2) for _ in range(r)])
            plens.append(p)
            a = rng.uniform(-1, 1)
            extras["adv"].append([0.0] * p + [a] * r)
            extras["temp"].append([t] * (p + r))
            extras["rollout_lp"].append([0.0] * p + [-rng.random() for _ in range(r)])
    return {"seqs": seqs, "masks": masks, "plens": plens, "groups": groups, "extras": extras}


def layouts(d: dict[str, Any], temps: bool) -> tuple[PackedBatch, PackedBatch]:
    """The same samples packed plainly and with shared prefixes (one row each)."""
    extras = {k: v for k, v in d["extras"].items() if temps or k != "temp"}
    plain = pack(d["seqs"], d["masks"], extras=extras)
    shared = pack_groups(d["seqs"], d["masks"], d["groups"], d["plens"], extras)
    return plain, shared


def expected_tokens(d: dict[str, Any]) -> int:
    """Tokens of a row that holds each prompt once: p - 1 + sum(r + 1) per group."""
    return sum(group_tokens([len(d["seqs"][i]) for i in g], d["plens"][g[0]]) for g in d["groups"])


@contextmanager
def rows_seen(policy: Any) -> Iterator[list[int]]:
    """Token counts the first transformer layer ran over, one per forward."""
    seen: list[int] = []

    def hook(module: Any, args: Any, kwargs: Any) -> None:
        hidden = kwargs.get("hidden_states", args[0] if args else None)
        seen.append(int(hidden.shape[0]))

    handle = policy.module.decoder.layers[0].register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield seen
    finally:
        handle.remove()


def compare_per_sample(plain: PackedBatch, shared: PackedBatch, a: torch.Tensor,
                       b: torch.Tensor, plens: list[int]) -> float:  # fmt: skip
    """Max |a - b| over every sample token but the prompt's last (a segment start when shared)."""
    pa, sb = sample_rows(plain), sample_rows(shared)
    worst = 0.0
    for i, rows in pa.items():
        keep = torch.ones(rows.numel(), dtype=torch.bool)
        if shared.prefix_of[shared.seq_ids.index(i)] >= 0:
            keep[plens[i] - 1] = False
        assert sb[i].numel() == rows.numel()
        worst = max(worst, float((a[rows][keep] - b[sb[i]][keep]).abs().max()))
    return worst


def segment_local_positions(batch: PackedBatch) -> torch.Tensor:
    """Positions restarting at 0 in every segment (what megatron-core's THD RoPE would use)."""
    starts = torch.repeat_interleave(batch.cu_seqlens[:-1].long(), torch.tensor(batch.seq_lens()))
    return torch.arange(batch.num_tokens) - starts


def main_grads(
    policy: Any, batches: list[PackedBatch], n_global: float, keep: bool = False
) -> dict[str, Any]:
    """Every parameter's gradient of an RL-shaped loss (policy term, entropy) over ``batches``
    (``keep``: leave them accumulated in the policy, e.g. to gather them in HF layout)."""

    def loss_fn(b: PackedBatch, lp: torch.Tensor, ent: torch.Tensor) -> Any:
        mask = b.loss_mask
        pg = -(b.extras["adv"] * torch.exp(lp - b.extras["rollout_lp"].detach()) * mask).sum()
        loss = (pg - 0.05 * (ent * mask).sum()) / n_global
        return loss, {"pg": float(pg.detach())}

    policy.zero_grad()
    policy.forward_backward(batches, loss_fn)
    grads = {n: p.main_grad.detach().clone() for n, p in policy.model.named_parameters()}
    if not keep:
        policy.zero_grad()
    return grads
