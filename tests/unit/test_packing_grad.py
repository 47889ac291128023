"""Packed vs unpacked vs padded gradients of one loss must agree (issue 8 acceptance).

The loss is a token-mean policy-gradient loss over all response tokens of the step (the global
normaliser ``N`` is computed once for the step, never per micro-batch):

    loss = -sum_t advantage[t] * logprob[t] * loss_mask[t] / N

Three ways of feeding the same four sequences must give the same gradient (fp32, < 1e-5):
all packed into one micro-batch (block-diagonal causal mask from ``cu_seqlens``), one sequence per
micro-batch with gradients accumulated, and a padded [B, S_max] batch.

The first test drives the real megatron-core GPTModel built by ``megatron_rl/model/gpt.py`` with
plain autograd; the second runs the same comparison through ``Policy.forward_backward`` (grads
in Megatron's DDP buffers, ``param.main_grad``).
"""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
import torch
from conftest import tiny_model_config

from megatron_rl.packing.batch import PackedBatch, pack

LENS = [5, 17, 9, 30]
CFG = tiny_model_config()  # 2 layers, hidden 64, head size 32, vocab 128


def make_data() -> tuple[list[list[int]], list[list[float]], list[list[float]]]:
    rng = random.Random(0)
    seqs = [[rng.randrange(CFG.vocab_size) for _ in range(n)] for n in LENS]
    masks = [[float(i >= n // 2) for i in range(n)] for n in LENS]  # response = second half
    advs = [[rng.uniform(-1, 1)] * n for n in LENS]
    return seqs, masks, advs


def one_per_batch(seqs, masks, advs) -> list[PackedBatch]:
    """One packed batch per sequence (the unpacked layout)."""
    return [pack([s], [m], extras={"adv": [a]}) for s, m, a in zip(seqs, masks, advs, strict=True)]


def block_causal_mask(cu_seqlens: torch.Tensor) -> torch.Tensor:
    """[1, 1, T, T] bool, True = masked: a query sees earlier keys of its own sequence only."""
    lens = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    seg = torch.repeat_interleave(torch.arange(len(lens)), lens)
    t = torch.arange(seg.numel())
    visible = (seg[:, None] == seg[None, :]) & (t[None, :] <= t[:, None])
    return (~visible)[None, None]


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, starts: torch.Tensor):
    """logits [T, V], tokens [T] -> logprobs [T] in the packing convention (0 at starts)."""
    lp = torch.log_softmax(logits.float(), -1)
    out = torch.zeros_like(tokens, dtype=lp.dtype)
    out[1:] = lp[:-1].gather(1, tokens[1:, None])[:, 0]
    return out.masked_fill(torch.zeros_like(out, dtype=torch.bool).index_fill(0, starts, True), 0)


def packed_loss(model, batch: PackedBatch, n_global: float) -> torch.Tensor:
    tokens = batch.tokens[None]
    logits = model(tokens, batch.position_ids[None], block_causal_mask(batch.cu_seqlens))[0]
    lp = token_logprobs(logits, batch.tokens, batch.cu_seqlens[:-1].long())
    return -(batch.extras["adv"] * lp * batch.loss_mask).sum() / n_global


def padded_loss(model, seqs, masks, advs, n_global: float) -> torch.Tensor:
    s_max = max(LENS)
    b = len(seqs)
    tokens = torch.zeros(b, s_max, dtype=torch.long)
    mask = torch.zeros(b, s_max)
    adv = torch.zeros(b, s_max)
    for i, (s, m, a) in enumerate(zip(seqs, masks, advs, strict=True)):
        tokens[i, : len(s)] = torch.tensor(s)
        mask[i, 1 : len(s)] = torch.tensor(m[1:])
        adv[i, : len(s)] = torch.tensor(a)
    causal = torch.ones(s_max, s_max, dtype=torch.bool).triu(1)[None, None].expand(b, 1, -1, -1)
    pos = torch.arange(s_max)[None].expand(b, -1)
    logits = model(tokens, pos, causal)
    lp = torch.log_softmax(logits.float(), -1)[:, :-1].gather(2, tokens[:, 1:, None])[..., 0]
    return -(adv[:, 1:] * lp * mask[:, 1:]).sum() / n_global


def grads_of(model, run: Callable[[], None]) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    run()
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys() and len(a) > 0
    for name in a:
        err = (a[name] - b[name]).abs().max().item()
        assert err < 1e-5, f"{name}: max abs diff {err:.2e}"


def test_packed_unpacked_padded_grads_agree_megatron_gpt(dist1) -> None:
    from megatron_rl.model.gpt import build_gpt_model

    model = build_gpt_model(CFG, pre_process=True, post_process=True)
    seqs, masks, advs = make_data()
    one = pack(seqs, masks, extras={"adv": advs})
    n_global = float(one.loss_mask.sum())  # response tokens of the whole step
    singles = one_per_batch(seqs, masks, advs)

    g_packed = grads_of(model, lambda: packed_loss(model, one, n_global).backward())

    def unpacked() -> None:
        for b in singles:
            packed_loss(model, b, n_global).backward()

    g_unpacked = grads_of(model, unpacked)
    g_padded = grads_of(model, lambda: padded_loss(model, seqs, masks, advs, n_global).backward())
    assert_same(g_packed, g_unpacked)
    assert_same(g_packed, g_padded)

    # The check has teeth: normalising per micro-batch instead of globally changes the grads.
    def per_microbatch_norm() -> None:
        for b in singles:
            packed_loss(model, b, float(b.loss_mask.sum()) * len(singles)).backward()

    g_wrong = grads_of(model, per_microbatch_norm)
    assert max((g_wrong[n] - g_packed[n]).abs().max().item() for n in g_packed) > 1e-4


def test_packed_unpacked_grads_agree_through_policy(dist1) -> None:
    policy_mod = pytest.importorskip("megatron_rl.model.policy", reason="Policy not landed yet")
    from megatron_rl.config.train import TrainConfig

    policy = policy_mod.Policy(CFG, dist1, TrainConfig(grad_clip=0.0))
    seqs, masks, advs = make_data()
    one = pack(seqs, masks, extras={"adv": advs})
    n_global = float(one.loss_mask.sum())
    singles = one_per_batch(seqs, masks, advs)

    def loss_fn(batch: PackedBatch, logprobs: torch.Tensor, entropy):
        loss = -(batch.extras["adv"] * logprobs * batch.loss_mask).sum() / n_global
        return loss, {"loss": loss.item()}

    def main_grads(batches: list[PackedBatch]) -> dict[str, torch.Tensor]:
        policy.zero_grad()
        policy.forward_backward(batches, loss_fn)
        return {n: p.main_grad.detach().clone() for n, p in policy.model.named_parameters()}

    # "padded": every sequence right-padded to the longest with masked pad tokens (the layout a
    # [B, S_max] batch has), one per micro-batch.
    s_max = max(LENS)
    padded = [
        pack(
            [s + [0] * (s_max - len(s))],
            [m + [0.0] * (s_max - len(s))],
            extras={"adv": [a + [0.0] * (s_max - len(s))]},
        )
        for s, m, a in zip(seqs, masks, advs, strict=True)
    ]
    g_packed = main_grads([one])
    assert sum(g.abs().sum().item() for g in g_packed.values()) > 0
    assert_same(g_packed, main_grads(singles))
    assert_same(g_packed, main_grads(padded))
