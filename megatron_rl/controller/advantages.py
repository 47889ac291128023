"""Advantage estimators for group-sampled RL: one function per variant, one registry.

All estimators map rewards of shape [G, n] (G prompts, n completions each) to advantages of
the same shape; each completion's advantage is then broadcast over its tokens by the loss.

- ``grpo``: (r - group mean) / (group std + eps) (Shao et al. 2024, DeepSeekMath). The std is
  the unbiased sample std (``torch.std``, n - 1 in the denominator), as in TRL and verl; a group
  with one sample, or with equal rewards, gets advantage 0. ``eps`` is ``ADVANTAGE_EPS`` = 1e-4,
  TRL's (``GRPOTrainer``: ``advantages / (std_rewards + 1e-4)``). It was 1e-6 (verl's) with no
  recorded reason, and the two differ where rewards are near-equal: a group of partial-credit
  rewards with std 0.04 gets advantages 0.25% smaller with 1e-4, which the gradient check
  against TRL (``tests/unit/test_trl_gradients.py``) sees; with 0/1 rewards (std >= 0.35 at
  n = 8) the difference is below 3e-4.
- ``drgrpo``: r - group mean, no std division (Liu et al. 2025, "Understanding R1-Zero-Like
  Training"); its other half, the constant length normaliser, is the loss aggregation
  ``seq_mean_token_sum`` with a fixed normaliser (see :mod:`megatron_rl.losses`).
- ``rloo``: r_i - mean of the other n - 1 rewards (Ahmadian et al. 2024), which equals
  n / (n - 1) * (r_i - group mean); 0 for n = 1.
- ``passthrough``: the rewards unchanged, for domains whose rewards are already centred dense
  scores (e.g. a learned or shaped reward with its own baseline).

Groups whose advantages are all 0 carry no gradient; the scheduler's filtering counts them.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

AdvantageFn = Callable[[Tensor, float], Tensor]
ADVANTAGE_EPS = 1e-4  # added to the group std by ``grpo``: TRL's value (module docstring)


def grpo(rewards: Tensor, eps: float) -> Tensor:
    """(r - mean) / (std + eps) within each group. [G, n] -> [G, n]."""
    n = rewards.shape[1]
    centred = rewards - rewards.mean(dim=1, keepdim=True)
    if n < 2:
        return torch.zeros_like(rewards)
    return centred / (rewards.std(dim=1, keepdim=True) + eps)


def drgrpo(rewards: Tensor, eps: float) -> Tensor:
    """r - mean within each group. [G, n] -> [G, n]."""
    del eps
    return rewards - rewards.mean(dim=1, keepdim=True)


def rloo(rewards: Tensor, eps: float) -> Tensor:
    """r_i minus the mean of the group's other rewards. [G, n] -> [G, n]."""
    del eps
    n = rewards.shape[1]
    if n < 2:
        return torch.zeros_like(rewards)
    others = (rewards.sum(dim=1, keepdim=True) - rewards) / (n - 1)
    return rewards - others


def passthrough(rewards: Tensor, eps: float) -> Tensor:
    """Rewards as advantages (a copy). [G, n] -> [G, n]."""
    del eps
    return rewards.clone()


ADVANTAGES: dict[str, AdvantageFn] = {
    "grpo": grpo,
    "drgrpo": drgrpo,
    "rloo": rloo,
    "passthrough": passthrough,
}


def compute_advantages(
    rewards: Tensor, estimator: str = "grpo", eps: float = ADVANTAGE_EPS
) -> Tensor:
    """Advantages of ``rewards`` [G, n] with the named estimator -> [G, n] (float32 or wider).

    Raises ``ValueError`` for an unknown estimator, a tensor that is not 2-D, or non-finite
    rewards (a reward function must never produce NaN; the caller reports which domain did).
    """
    if estimator not in ADVANTAGES:
        raise ValueError(
            f"rl.advantage={estimator!r} is not a known estimator; choose one of {list(ADVANTAGES)}"
        )
    if rewards.dim() != 2:
        raise ValueError(f"rewards must have shape [groups, n], got {tuple(rewards.shape)}")
    if not torch.isfinite(rewards).all():
        raise ValueError("rewards contain NaN or inf; fix the reward function that produced them")
    if not rewards.is_floating_point() or rewards.dtype in (torch.float16, torch.bfloat16):
        rewards = rewards.float()
    return ADVANTAGES[estimator](rewards, eps)
