"""Advantage estimators against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from megatron_rl.controller.advantages import ADVANTAGE_EPS, ADVANTAGES, compute_advantages

REWARDS = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 3.0], [2.0, 2.0, 2.0, 2.0]])


def test_grpo_mean_and_unbiased_std() -> None:
    adv = compute_advantages(REWARDS, "grpo", eps=0.0 + 1e-6)
    # group 0: mean 0.5, unbiased std sqrt(4 * 0.25 / 3) = sqrt(1/3)
    s0 = math.sqrt(1 / 3)
    expected0 = torch.tensor([0.5, -0.5, -0.5, 0.5]) / (s0 + 1e-6)
    # group 1: mean 0.75, deviations (-.75, -.75, -.75, 2.25), var = (3 * .5625 + 5.0625) / 3
    s1 = math.sqrt((3 * 0.5625 + 5.0625) / 3)
    expected1 = torch.tensor([-0.75, -0.75, -0.75, 2.25]) / (s1 + 1e-6)
    torch.testing.assert_close(adv[0], expected0)
    torch.testing.assert_close(adv[1], expected1)
    # equal rewards: zero advantage, no NaN from the zero std
    assert torch.equal(adv[2], torch.zeros(4))


def test_grpo_default_eps_is_trls() -> None:
    """The default std epsilon is TRL's 1e-4 (``GRPOTrainer``: advantages / (std + 1e-4))."""
    assert ADVANTAGE_EPS == 1e-4
    r = REWARDS[:2]
    expected = (r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-4)
    torch.testing.assert_close(compute_advantages(r), expected, rtol=0, atol=1e-7)


def test_drgrpo_is_mean_only() -> None:
    adv = compute_advantages(REWARDS, "drgrpo")
    torch.testing.assert_close(adv[1], torch.tensor([-0.75, -0.75, -0.75, 2.25]))
    torch.testing.assert_close(adv[0], torch.tensor([0.5, -0.5, -0.5, 0.5]))


def test_rloo_leave_one_out() -> None:
    adv = compute_advantages(REWARDS, "rloo")
    # group 1, sample 3: 3 - mean(0, 0, 0) = 3; sample 0: 0 - mean(0, 0, 3) = -1
    torch.testing.assert_close(adv[1], torch.tensor([-1.0, -1.0, -1.0, 3.0]))
    # identity: rloo = n / (n - 1) * (r - mean)
    torch.testing.assert_close(adv, 4 / 3 * compute_advantages(REWARDS, "drgrpo"))


def test_passthrough_copies() -> None:
    adv = compute_advantages(REWARDS, "passthrough")
    assert torch.equal(adv, REWARDS)
    adv[0, 0] = 99.0
    assert REWARDS[0, 0] == 1.0


@pytest.mark.parametrize("name", sorted(ADVANTAGES))
def test_shapes_and_single_sample_groups(name: str) -> None:
    rewards = torch.tensor([[0.3], [1.0]])
    adv = compute_advantages(rewards, name)
    assert adv.shape == (2, 1)
    if name == "passthrough":
        assert torch.equal(adv, rewards)
    else:
        assert torch.equal(adv, torch.zeros(2, 1))  # no baseline from one sample: no signal


def test_integer_rewards_are_promoted() -> None:
    adv = compute_advantages(torch.tensor([[1, 0]]), "drgrpo")
    assert adv.dtype == torch.float32
    torch.testing.assert_close(adv, torch.tensor([[0.5, -0.5]]))


def test_bad_input_messages() -> None:
    with pytest.raises(ValueError, match="grpo.*drgrpo.*rloo.*passthrough"):
        compute_advantages(REWARDS, "ppo")
    with pytest.raises(ValueError, match=r"\[groups, n\]"):
        compute_advantages(torch.zeros(4), "grpo")
    with pytest.raises(ValueError, match="NaN"):
        compute_advantages(torch.tensor([[1.0, float("nan")]]), "grpo")
