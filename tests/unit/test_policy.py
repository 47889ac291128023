"""Policy on one CPU process: logits, packed log-probs, training, grad accumulation, state.

Real megatron-core GPTModel, Megatron DDP and optimizer over gloo (world size 1), via the compat
layer. Multi-process TP/PP equivalence lives in test_parallel_equivalence.py.
"""

from __future__ import annotations

import random

import pytest
import torch
from conftest import tiny_model_config

from megatron_rl.config.train import TrainConfig
from megatron_rl.model.policy import Policy
from megatron_rl.packing.batch import PackedBatch, pack

# init_std 0.1 (not 0.02) so logits are O(1): RoPE offsets and rounding would show up.
CFG = tiny_model_config(init_std=0.1)


def random_seqs(lens: list[int], seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(CFG.vocab_size) for _ in range(n)] for n in lens]


def packed(seqs: list[list[int]]) -> PackedBatch:
    return pack(seqs, [[1.0] * len(s) for s in seqs])


def nll(batch: PackedBatch, logprobs: torch.Tensor, entropy: torch.Tensor, norm: float = 0.0):
    """Summed NLL over response tokens divided by ``norm`` (batch's own token count if 0)."""
    total = (logprobs * batch.loss_mask).sum()
    loss = -total / (norm or float(batch.loss_mask.sum()))
    return loss, {"nll": loss.detach()}


@pytest.fixture(scope="module")
def policy(dist1) -> Policy:
    torch.manual_seed(0)
    return Policy(CFG, dist1, TrainConfig(lr=1e-2, grad_clip=1.0))


def main_grads(policy: Policy) -> dict[str, torch.Tensor]:
    params = policy.model.named_parameters()
    return {n: p.main_grad.detach().clone() for n, p in params}  # type: ignore[attr-defined]


def test_logits_shape_finite_and_match_logprobs(policy: Policy) -> None:
    seq = random_seqs([12])[0]
    logits = policy.logits(torch.tensor([seq, seq[::-1]]))
    assert logits.shape == (2, 12, CFG.vocab_size)
    assert torch.isfinite(logits).all() and logits.std() > 0.1
    ((lp, ent),) = policy.token_logprobs([packed([seq])], temperature=0.7, with_entropy=True)
    ref = torch.log_softmax(logits[0] / 0.7, -1)
    want_lp = torch.cat([torch.zeros(1), ref[:-1].gather(1, torch.tensor(seq)[1:, None])[:, 0]])
    want_ent = torch.cat([torch.zeros(1), -(ref.exp() * ref).sum(-1)[:-1]])
    torch.testing.assert_close(lp, want_lp, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent, want_ent, atol=1e-5, rtol=0)


def test_packed_logprobs_equal_separate_runs(policy: Policy) -> None:
    seqs = random_seqs([5, 17, 9, 30], seed=1)
    batch = packed(seqs)
    ((lp, ent),) = policy.token_logprobs([batch], with_entropy=True)
    alone = policy.token_logprobs([packed([s]) for s in seqs], with_entropy=True)
    starts = batch.cu_seqlens[:-1].tolist()
    assert ent is not None
    assert lp[starts].abs().max() == 0 and ent[starts].abs().max() == 0
    assert lp[1:5].abs().min() > 0.1  # real log-probs, not zeros
    for i, (lp_i, ent_i) in enumerate(alone):
        lo, hi = int(batch.cu_seqlens[i]), int(batch.cu_seqlens[i + 1])
        assert (lp[lo:hi] - lp_i).abs().max() < 1e-5
        assert ent_i is not None and (ent[lo:hi] - ent_i).abs().max() < 1e-5
    # Without the block mask the later sequences would see the earlier ones: the mask matters.
    full = policy.logits(batch.tokens[None])[0]
    joint = torch.log_softmax(full, -1)[5:21].gather(1, batch.tokens[6:22, None])[:, 0]
    assert (joint - lp[6:22]).abs().max() > 1e-3


def test_training_reduces_loss(dist1) -> None:
    torch.manual_seed(0)
    pol = Policy(CFG, dist1, TrainConfig(lr=3e-3, grad_clip=1.0))
    batch = packed(random_seqs([20, 20], seed=2))
    losses, stats = [], []
    for _ in range(8):
        (metrics,) = pol.forward_backward([batch], nll)
        stats.append(pol.optimizer_step(lr=3e-3))
        losses.append(metrics["loss"])
    assert metrics["nll"] == pytest.approx(metrics["loss"])
    assert losses[-1] < losses[0] - 0.5, losses
    assert all(s["skipped"] == 0.0 and s["grad_norm"] > 0 for s in stats)


def test_grads_accumulate_over_microbatches(policy: Policy) -> None:
    seqs = random_seqs([6, 11, 8, 13], seed=3)
    whole = packed(seqs)
    halves = [packed(seqs[:2]), packed(seqs[2:])]
    n = float(whole.loss_mask.sum())

    def loss_fn(b, lp, ent):
        return nll(b, lp, ent, norm=n)

    policy.zero_grad()
    policy.forward_backward([whole], loss_fn)
    g_one = main_grads(policy)
    policy.zero_grad()
    metrics = policy.forward_backward(halves, loss_fn)
    g_two = main_grads(policy)
    policy.zero_grad()
    assert len(metrics) == 2
    for name in g_one:
        assert (g_one[name] - g_two[name]).abs().max() < 1e-6, name
    assert max(g.abs().max() for g in g_one.values()) > 1e-3
    # The sum over micro-batches is the caller's loss: no hidden 1/num_microbatches.
    assert sum(m["loss"] for m in metrics) == pytest.approx(
        -float(policy.token_logprobs([whole])[0][0].sum()) / n, abs=1e-5
    )


def test_nan_loss_skips_the_step(policy: Policy) -> None:
    before = {k: v.clone() for k, v in policy.model_state_shard().items()}
    batch = packed(random_seqs([9], seed=4))
    policy.forward_backward([batch], lambda b, lp, ent: (lp.sum() * float("nan"), {}))
    stats = policy.optimizer_step(lr=1e-2)
    assert stats["skipped"] == 1.0 and stats["lr"] == 1e-2
    after = policy.model_state_shard()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_state_round_trip_resumes_exactly(dist1) -> None:
    torch.manual_seed(0)
    pol = Policy(CFG, dist1, TrainConfig(lr=1e-2, grad_clip=1.0))
    batch = packed(random_seqs([15, 10], seed=5))

    def step() -> None:
        pol.forward_backward([batch], nll)
        pol.optimizer_step(lr=1e-2)

    step()
    model_sd, opt_sd = pol.model_state_shard(), pol.optimizer_state()
    step()
    step()
    want = pol.model_state_shard()
    pol.load_model_state_shard(model_sd)
    pol.load_optimizer_state(opt_sd)
    step()
    step()
    got = pol.model_state_shard()
    for k in want:
        assert torch.equal(want[k], got[k]), k
    steps = [s["step"] for s in pol.optimizer.chained_optimizers[0].optimizer.state.values()]
    assert len({id(s) for s in steps}) == len(steps)  # one Adam step tensor per parameter


def test_hf_state_dict_round_trip(policy: Policy, dist1) -> None:
    hf = policy.hf_state_dict()
    assert "model.layers.1.mlp.down_proj.weight" in hf and "lm_head.weight" in hf
    tokens = torch.tensor(random_seqs([10], seed=6))
    want = policy.logits(tokens)
    other = Policy(CFG, dist1)
    assert (other.logits(tokens) - want).abs().max() > 1e-3  # different random init
    other.load_hf_state_dict(hf)
    torch.testing.assert_close(other.logits(tokens), want, atol=0, rtol=0)
    with pytest.raises(ValueError, match="missing"):
        other.load_hf_state_dict({k: v for k, v in hf.items() if "layers.0" not in k})


@pytest.mark.parametrize("recompute", ["full", "selective"])
def test_recompute_gives_same_grads(dist1, recompute: str) -> None:
    batch = packed(random_seqs([12, 7], seed=7))
    plain = Policy(CFG, dist1, TrainConfig(lr=1e-2))
    plain.forward_backward([batch], nll)
    recomputing = Policy(tiny_model_config(init_std=0.1, recompute=recompute), dist1, TrainConfig())
    recomputing.load_model_state_shard(plain.model_state_shard())
    recomputing.forward_backward([batch], nll)
    want, got = main_grads(plain), main_grads(recomputing)
    for name in want:
        assert (want[name] - got[name]).abs().max() < 1e-6, name
