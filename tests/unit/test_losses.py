"""Policy-loss values and gradients against hand-computed examples."""

from __future__ import annotations

import math
from typing import Any, cast

import pytest
import torch

from megatron_rl.config.train import RLConfig
from megatron_rl.losses import (
    LossAgg,
    aggregate,
    entropy_from_logits,
    kl_estimate,
    kl_reward_penalty,
    logp_mismatch,
    policy_loss,
    rl_loss,
    step_normalizer,
)


def _pl(
    logp: torch.Tensor,
    old: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    normalizer: float,
    agg: str = "token_mean",
    **kw: Any,
) -> tuple[torch.Tensor, dict[str, float]]:
    """policy_loss with clip_low=0.2, clip_high=0.28."""
    return policy_loss(
        logp,
        old,
        adv,
        mask,
        clip_low=0.2,
        clip_high=0.28,
        agg=cast(LossAgg, agg),
        normalizer=normalizer,
        **kw,
    )


def _single_tokens(ratios: list[float]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One token per sequence with given ratios: (logp with grad, old_logp, mask), [B, 1]."""
    old = torch.full((len(ratios), 1), -1.0)
    logp = (old + torch.log(torch.tensor(ratios))[:, None]).requires_grad_()
    return logp, old, torch.ones(len(ratios), 1)


def test_first_step_ratio_one_is_minus_advantage() -> None:
    old = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.7, -0.9]])
    logp = old.clone().requires_grad_()
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    adv = torch.tensor([1.0, -0.5])
    loss, m = _pl(logp, old, adv, mask, 3.0)
    # (-1 - 1 + 0.5) / 3 tokens
    assert loss.item() == pytest.approx(-0.5)
    loss.backward()
    assert logp.grad is not None
    expected = torch.tensor([[-1 / 3, -1 / 3, 0.0], [0.5 / 3, 0.0, 0.0]])
    torch.testing.assert_close(logp.grad, expected)
    assert m["loss/clip_frac"] == 0.0
    assert m["loss/ratio_mean"] == pytest.approx(1.0)
    assert m["loss/pg"] == pytest.approx(-0.5)


def test_asymmetric_clip_values_and_gradients() -> None:
    # ratio 1.5 with A>0 clips at 1.28; ratio 0.5 with A<0 clips at 0.8 (pessimistic side);
    # the other two lie on the unclipped side and keep their gradient.
    logp, old, mask = _single_tokens([1.5, 0.5, 1.5, 0.5])
    adv = torch.tensor([1.0, -1.0, -1.0, 1.0])
    loss, m = _pl(logp, old, adv, mask, 4.0)
    assert loss.item() == pytest.approx((-1.28 + 0.8 + 1.5 - 0.5) / 4)
    assert m["loss/clip_frac"] == pytest.approx(0.5)
    loss.backward()
    assert logp.grad is not None
    torch.testing.assert_close(logp.grad[:, 0], torch.tensor([0.0, 0.0, 1.5 / 4, -0.5 / 4]))


def test_dual_clip_caps_negative_advantages() -> None:
    logp, old, mask = _single_tokens([5.0, 2.0])
    adv = torch.tensor([-1.0, -1.0])
    loss, m = _pl(logp, old, adv, mask, 2.0, dual_clip=3.0)
    # token 0: max(5, 1.28) = 5 > c = 3 -> 3 (no gradient); token 1: 2 < 3 stays
    assert loss.item() == pytest.approx((3.0 + 2.0) / 2)
    assert m["loss/dual_clip_frac"] == pytest.approx(0.5)
    loss.backward()
    assert logp.grad is not None
    torch.testing.assert_close(logp.grad[:, 0], torch.tensor([0.0, 2.0 / 2]))
    no_dual, _ = _pl(logp, old, adv, mask, 2.0)
    assert no_dual.item() == pytest.approx((5.0 + 2.0) / 2)


def test_truncated_importance_sampling() -> None:
    old = torch.tensor([[-1.0], [-1.0]])
    logp = old.clone().requires_grad_()
    # pi_old / pi_rollout = 3 (capped to 2) and 0.5
    rollout = old - torch.log(torch.tensor([[3.0], [0.5]]))
    adv = torch.tensor([1.0, 1.0])
    loss, m = _pl(logp, old, adv, torch.ones(2, 1), 2.0, rollout_logp=rollout, tis_cap=2.0)
    assert loss.item() == pytest.approx((-2.0 - 0.5) / 2)
    assert m["loss/tis_clip_frac"] == pytest.approx(0.5)
    assert m["loss/tis_weight_mean"] == pytest.approx(1.25)
    loss.backward()
    assert logp.grad is not None
    torch.testing.assert_close(logp.grad[:, 0], torch.tensor([-1.0, -0.25]))


@pytest.mark.parametrize(
    "agg, normalizer, expected",
    [
        ("token_mean", 4.0, -(1 + 2 + 3 + 4) / 4),
        ("seq_mean_token_sum", 2.0, -(6 + 4) / 2),
        ("seq_mean_token_mean", 2.0, -(2 + 4) / 2),
    ],
)
def test_aggregations(agg: str, normalizer: float, expected: float) -> None:
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    adv = torch.tensor([[1.0, 2.0, 3.0, 100.0], [4.0, 100.0, 100.0, 100.0]])
    old = torch.zeros(2, 4)
    assert step_normalizer([mask], cast(LossAgg, agg)) == normalizer
    loss, _ = _pl(old.clone(), old, adv, mask, normalizer, agg)
    assert loss.item() == pytest.approx(expected)


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_sum", "seq_mean_token_mean"])
def test_micro_batches_sum_to_the_full_batch(agg: str) -> None:
    gen = torch.Generator().manual_seed(0)
    old = -torch.rand(6, 5, generator=gen) * 3
    logp = (old + 0.4 * torch.randn(6, 5, generator=gen)).requires_grad_()
    adv = torch.randn(6, generator=gen)
    mask = (torch.rand(6, 5, generator=gen) > 0.3).float()
    mask[:, 0] = 1.0
    full_n = step_normalizer([mask], cast(LossAgg, agg))
    full, _ = _pl(logp, old, adv, mask, full_n, agg)
    (full_grad,) = torch.autograd.grad(full, logp)
    parts = [slice(0, 2), slice(2, 6)]
    n = step_normalizer([mask[p] for p in parts], cast(LossAgg, agg))
    assert n == full_n
    total = _pl(logp[parts[0]], old[parts[0]], adv[parts[0]], mask[parts[0]], n, agg)[0]
    total = total + _pl(logp[parts[1]], old[parts[1]], adv[parts[1]], mask[parts[1]], n, agg)[0]
    (split_grad,) = torch.autograd.grad(total, logp)
    assert total.item() == pytest.approx(full.item(), rel=1e-6)
    torch.testing.assert_close(split_grad, full_grad)


def test_kl_estimators_by_hand() -> None:
    logp = torch.tensor([[math.log(0.5)]])
    ref = torch.tensor([[math.log(0.25)]])
    x = math.log(0.5)  # ref - logp
    assert kl_estimate(logp, ref, "k1").item() == pytest.approx(-x)
    assert kl_estimate(logp, ref, "k2").item() == pytest.approx(0.5 * x * x)
    assert kl_estimate(logp, ref, "k3").item() == pytest.approx(0.5 - 1 - x)
    for est in ("k1", "k2", "k3"):
        assert kl_estimate(logp, logp, est).item() == 0.0  # type: ignore[arg-type]


def test_k1_and_k3_are_unbiased_kl_estimates() -> None:
    p = torch.tensor([0.6, 0.3, 0.1])
    q = torch.tensor([0.2, 0.3, 0.5])
    exact = float((p * (p / q).log()).sum())
    tokens = torch.multinomial(
        p, 200_000, replacement=True, generator=torch.Generator().manual_seed(1)
    )
    logp, ref = p.log()[tokens][None], q.log()[tokens][None]
    for est in ("k1", "k3"):
        mc = kl_estimate(logp, ref, est).mean().item()  # type: ignore[arg-type]
        assert mc == pytest.approx(exact, abs=0.01), est
    assert (kl_estimate(logp, ref, "k3") >= 0).all()


def test_kl_reward_penalty_sums_over_response() -> None:
    logp = torch.tensor([[-1.0, -2.0, -3.0]])
    ref = torch.tensor([[-1.5, -2.0, -9.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    pen = kl_reward_penalty(logp, ref, mask, coef=0.1, estimator="k1")
    torch.testing.assert_close(pen, torch.tensor([0.1 * 0.5]))


def test_entropy_of_uniform_and_one_hot() -> None:
    logits = torch.stack([torch.zeros(8), torch.tensor([50.0] + [0.0] * 7)])[None]
    ent = entropy_from_logits(logits)
    torch.testing.assert_close(ent, torch.tensor([[math.log(8), 0.0]]), atol=1e-5, rtol=0)


def test_rl_loss_combines_terms() -> None:
    old = torch.tensor([[-1.0, -2.0]])
    logp = old.clone().requires_grad_()
    ref = torch.tensor([[-1.5, -2.0]])
    ent = torch.tensor([[0.7, 0.3]])
    mask = torch.ones(1, 2)
    cfg = RLConfig(kl_coef=0.1, kl_estimator="k1", entropy_coef=0.01, tis_cap=None)
    loss, m = rl_loss(logp, old, torch.tensor([2.0]), mask, cfg, 2.0, ref_logp=ref, entropy=ent)
    pg, kl, h = -2.0, 0.5 / 2, 1.0 / 2
    assert m["loss/pg"] == pytest.approx(pg)
    assert m["loss/kl"] == pytest.approx(kl)
    assert m["loss/entropy"] == pytest.approx(h)
    assert loss.item() == pytest.approx(pg + 0.1 * kl - 0.01 * h)
    assert m["loss/total"] == pytest.approx(loss.item())
    # KL as a reward penalty: logged, not added to the loss
    cfg.kl_in_reward = True
    loss2, _ = rl_loss(logp, old, torch.tensor([2.0]), mask, cfg, 2.0, ref_logp=ref, entropy=ent)
    assert loss2.item() == pytest.approx(pg - 0.01 * h)


def test_rl_loss_missing_inputs_are_named() -> None:
    x = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="ref_logp"):
        rl_loss(x, x, torch.ones(1), torch.ones(1, 2), RLConfig(kl_coef=0.1), 2.0)
    with pytest.raises(ValueError, match="entropy"):
        rl_loss(x, x, torch.ones(1), torch.ones(1, 2), RLConfig(entropy_coef=0.1), 2.0)
    with pytest.raises(ValueError, match="token_mean"):
        aggregate(x, torch.ones(1, 2), "sum", 1.0)  # type: ignore[arg-type]


def test_mismatch_ignores_padding_and_adds_over_micro_batches() -> None:
    train = torch.tensor([[-1.0, -2.0, -3.0]])
    rollout = torch.tensor([[-1.1, -1.7, 50.0]])
    m = logp_mismatch(train, rollout, torch.tensor([[1, 1, 0]]))
    assert (m.sum, m.max, m.tokens) == (pytest.approx(0.4), pytest.approx(0.3), 2.0)
    assert m.mean == pytest.approx(0.2)
    none = logp_mismatch(train, rollout, torch.zeros(1, 3))
    assert (none.max, none.mean, none.tokens) == (0.0, 0.0, 0.0)
    empty = logp_mismatch(torch.zeros(0), torch.zeros(0), torch.zeros(0))
    assert (empty.sum, empty.max) == (0.0, 0.0)
    # packed rows [T] of two micro-batches: sums and counts add, maxima max, the mean comes last
    a = logp_mismatch(train[0], rollout[0], torch.tensor([1.0, 0.0, 0.0]))
    b = logp_mismatch(train[0], rollout[0], torch.tensor([0.0, 1.0, 0.0]))
    assert (a.sum + b.sum) / (a.tokens + b.tokens) == pytest.approx(m.mean)
    assert max(a.max, b.max) == pytest.approx(m.max)
