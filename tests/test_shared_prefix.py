"""Shared-prefix packing (``long_context.packing.pack_groups``) equals plain packing.

A GRPO group's samples share their prompt. Shared-prefix rows hold the prompt once, then each
response attending to it (``megatron_rl/model/attention.py``: varlen attention with a prefix
segment, RoPE by per-token position). Everything the trainer computes from them must equal plain
packing (one sequence per sample) within fp32 rounding: log-probs and entropies at two
temperatures and at per-token temperatures, and the gradient of every parameter.

Each check also has teeth against the two ways it could be silently wrong:
- the prefix computed once per sample (plain packing under another name) would give equal
  numbers, so every test asserts the row holds each prompt once and that the transformer layers
  ran over exactly that many tokens (a hook on the first layer);
- RoPE positions restarting in every segment (megatron-core's default THD RoPE) is shown to
  change the log-probs by far more than the tolerance.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from conftest import tiny_model_config

from long_context.packing import PackedBatch, group_bins, group_tokens, pack, pack_groups
from long_context.packing import sample_rows

CFG = tiny_model_config(max_position_embeddings=256)
PROMPTS = [9, 14, 5, 2]  # prompt length per group (2: the smallest prompt that is shared)
SIZES = [4, 3, 4, 2]  # members per group
TEMPS = [1.0, 0.7, 1.3, 1.0]  # each group's sampling temperature (extras["temp"])


def make_groups(seed: int = 0) -> dict[str, Any]:
    """Samples of four groups: prompt + response tokens, masks (env tokens 0), extras."""
    rng = random.Random(seed)
    seqs, masks, plens, groups = [], [], [], []
    extras: dict[str, list[list[float]]] = {"adv": [], "temp": [], "rollout_lp": []}
    for p, g, t in zip(PROMPTS, SIZES, TEMPS, strict=True):
        prompt = [rng.randrange(CFG.vocab_size) for _ in range(p)]
        groups.append(list(range(len(seqs), len(seqs) + g)))
        for _ in range(g):
            r = rng.randint(1, 12)
            seqs.append(prompt + [rng.randrange(CFG.vocab_size) for _ in range(r)])
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


@pytest.fixture(scope="module")
def policy(dist1: Any) -> Any:
    from megatron_rl.model.policy import Policy
    from megatron_rl.train.config import TrainConfig

    torch.manual_seed(0)
    return Policy(CFG, dist1, TrainConfig(lr=1e-3, grad_clip=0.0))


def test_layout_holds_each_prompt_once() -> None:
    d = make_groups()
    plain, shared = layouts(d, temps=True)
    assert shared.num_tokens == expected_tokens(d) < plain.num_tokens
    assert shared.shared_prefix and not plain.shared_prefix
    # positions continue from the prompt's end in every response segment
    for rows_p, rows_s in zip(sample_rows(plain).values(), sample_rows(shared).values(),
                              strict=True):  # fmt: skip
        assert shared.position_ids[rows_s].tolist() == list(range(rows_p.numel()))
        assert torch.equal(plain.tokens[rows_p], shared.tokens[rows_s])
    # the loss mask and every extra land on the same sample tokens
    for key in ("adv", "rollout_lp"):
        a, b = plain.extras[key], shared.extras[key]
        assert compare_per_sample(plain, shared, a, b, d["plens"]) == 0.0
    assert compare_per_sample(plain, shared, plain.loss_mask, shared.loss_mask, d["plens"]) == 0.0
    assert float(plain.loss_mask.sum()) == float(shared.loss_mask.sum())


def test_pack_groups_refuses_what_cannot_be_shared() -> None:
    d = make_groups()
    bad = [list(s) for s in d["seqs"]]
    bad[1][0] = (bad[1][0] + 1) % CFG.vocab_size
    with pytest.raises(ValueError, match="does not start with its group's prompt"):
        pack_groups(bad, d["masks"], d["groups"], d["plens"])
    masks = [list(m) for m in d["masks"]]
    masks[0][3] = 1.0
    with pytest.raises(ValueError, match="trains prompt tokens"):
        pack_groups(d["seqs"], masks, d["groups"], d["plens"])
    temps = [list(t) for t in d["extras"]["temp"]]
    temps[1] = [0.5] * len(temps[1])
    with pytest.raises(ValueError, match="extra 'temp'"):
        pack_groups(d["seqs"], d["masks"], d["groups"], d["plens"], {"temp": temps})


def test_group_bins_split_a_group_over_budget() -> None:
    lens, plens = [30, 32, 31, 29, 5], [20, 20, 20, 20, 3]
    bins = group_bins([[0, 1, 2, 3], [4]], lens, plens, budget=45)
    chunks = [c for b in bins for c in b]
    assert sorted(i for c in chunks for i in c) == [0, 1, 2, 3, 4]
    for b in bins:  # every row fits, each chunk carrying its own copy of the prompt
        assert sum(group_tokens([lens[i] for i in c], plens[c[0]]) for c in b) <= 45
    assert len([c for c in chunks if 0 in c or 3 in c]) >= 2


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_logprobs_and_entropy_equal_plain_packing(policy: Any, temperature: float) -> None:
    d = make_groups()
    plain, shared = layouts(d, temps=False)
    with rows_seen(policy) as seen:
        (lp_s, ent_s), = policy.token_logprobs([shared], temperature, with_entropy=True)  # fmt: skip
    assert seen == [expected_tokens(d)]  # the layers ran over each prompt once
    (lp_p, ent_p), = policy.token_logprobs([plain], temperature, with_entropy=True)  # fmt: skip
    assert compare_per_sample(plain, shared, lp_p, lp_s, d["plens"]) < 1e-5
    assert compare_per_sample(plain, shared, ent_p, ent_s, d["plens"]) < 1e-5
    # teeth: RoPE positions restarting in every segment change the result
    restarted = pack_groups(d["seqs"], d["masks"], d["groups"], d["plens"])
    restarted.position_ids = segment_local_positions(restarted)
    (lp_r, _), = policy.token_logprobs([restarted], temperature)  # fmt: skip
    assert compare_per_sample(plain, restarted, lp_p, lp_r, d["plens"]) > 1e-3


def segment_local_positions(batch: PackedBatch) -> torch.Tensor:
    """Positions restarting at 0 in every segment (what megatron-core's THD RoPE would use)."""
    starts = torch.repeat_interleave(batch.cu_seqlens[:-1].long(), torch.tensor(batch.seq_lens()))
    return torch.arange(batch.num_tokens) - starts


def main_grads(policy: Any, batches: list[PackedBatch], n_global: float) -> dict[str, Any]:
    """Every parameter's gradient of an RL-shaped loss (policy term, entropy) over ``batches``."""

    def loss_fn(b: PackedBatch, lp: torch.Tensor, ent: torch.Tensor) -> Any:
        mask = b.loss_mask
        pg = -(b.extras["adv"] * torch.exp(lp - b.extras["rollout_lp"].detach()) * mask).sum()
        loss = (pg - 0.05 * (ent * mask).sum()) / n_global
        return loss, {"pg": float(pg)}

    policy.zero_grad()
    policy.forward_backward(batches, loss_fn)
    grads = {n: p.main_grad.detach().clone() for n, p in policy.model.named_parameters()}
    policy.zero_grad()
    return grads


def test_grads_equal_plain_packing_per_token_temperature(policy: Any) -> None:
    d = make_groups(seed=1)
    plain, shared = layouts(d, temps=True)
    (lp_p, ent_p), = policy.token_logprobs([plain], with_entropy=True)  # fmt: skip
    (lp_s, ent_s), = policy.token_logprobs([shared], with_entropy=True)  # fmt: skip
    assert compare_per_sample(plain, shared, lp_p, lp_s, d["plens"]) < 1e-5
    assert compare_per_sample(plain, shared, ent_p, ent_s, d["plens"]) < 1e-5
    n = float(plain.loss_mask.sum())
    g_plain = main_grads(policy, [plain], n)
    with rows_seen(policy) as seen:
        g_shared = main_grads(policy, [shared], n)
    assert seen == [expected_tokens(d)]
    assert g_plain.keys() == g_shared.keys() and len(g_plain) >= 10
    assert sum(float(g.abs().sum()) for g in g_plain.values()) > 0
    for name, g in g_plain.items():
        err = float((g - g_shared[name]).abs().max())
        assert err < 1e-5, f"{name}: max abs diff {err:.2e}"
    # split over two rows (a group per row boundary) it is the same gradient
    bins = group_bins(d["groups"], [len(s) for s in d["seqs"]], d["plens"], budget=60)
    assert len(bins) >= 2
    rows = [pack_groups(d["seqs"], d["masks"], b, d["plens"], d["extras"]) for b in bins]
    g_rows = main_grads(policy, rows, n)
    assert max(float((g - g_rows[k]).abs().max()) for k, g in g_plain.items()) < 1e-5
