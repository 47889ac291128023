"""GRPO-family policy losses: clipped policy gradient, KL to a reference, entropy bonus, TIS.

Both halves of a step use this module: the trainer ranks (``train/step.py``) and the controller
on rank 0, which computes the step normaliser over every DP share and the KL reward penalty
(``controller/``); so it sits below both, not in ``train/``.

Notation (all per sampled response token, shapes [B, T]: B sequences, T padded length):
``logp`` log-prob of the token under the policy being trained (has grad); ``old_logp`` the same
under the policy that the step started from, computed by the trainer (``pi_old``, no grad);
``rollout_logp`` what the rollout engine reported when sampling (``pi_rollout``); ``ref_logp``
under the frozen reference; ``mask`` 1 on response tokens, 0 on prompt and padding.
``advantages`` are per sequence [B] or per token [B, T]. All log-probs follow the rollout
convention (temperature-scaled, see :mod:`megatron_rl.rollout.base`).

Policy term (PPO, Schulman et al. 2017) with the clip-higher of DAPO (Yu et al. 2025): the
ratio r = exp(logp - old_logp) is clipped to [1 - clip_low, 1 + clip_high] and the loss per
token is max(-A r, -A clip(r)). Dual clip (Ye et al. 2020): for A < 0 the loss is also capped at
-A c. On the first update of a batch r == 1, and the loss is -A with gradient -A * dlogp.

Truncated importance sampling (Yao et al. 2025, "Your efficient RL framework secretly brings
you off-policy RL training"): engines and trainer compute slightly different probabilities, so
the policy term is weighted by w = min(exp(old_logp - rollout_logp), tis_cap), a constant (no
gradient through it).

KL to the reference with Schulman's estimators (http://joschu.net/blog/kl-approx.html), samples
from the policy, x = ref_logp - logp: k1 = -x, k2 = x^2 / 2, k3 = exp(x) - 1 - x (clamped to
``K3_CLAMP`` as in verl's ``low_var_kl``, so one token with a huge ratio cannot dominate a step).
All three are estimates of the *value* KL(pi || pi_ref). As a *loss* (added with ``kl_coef``)
what matters is the gradient each one gives in expectation over tokens sampled from pi
(differentiating through logp):

- k1: E_pi[grad(-x)] = E_pi[grad logp] = 0. A no-op as a loss; config load refuses it.
- k2: E_pi[(logp - ref_logp) grad logp] = grad KL(pi || pi_ref), the reverse KL it names.
- k3: E_pi[(1 - pi_ref / pi) grad logp] = grad KL(pi_ref || pi), the forward KL.

So k2 is the loss that follows the reverse KL the value names; k3 (the GRPO paper's choice)
pulls towards the reference through the forward KL: it has the same minimum and the same
first-order behaviour near pi = pi_ref, but it is a different gradient. As a reward penalty
(``kl_in_reward``, the RL loop calls :func:`kl_reward_penalty` through
``batches.kl_reward_penalties``) the estimator is evaluated on the sampling policy's log-probs
and summed over each sequence; there k1 gives an unbiased estimate of the KL-regularised return
(RLHF/PPO style), and the gradient flows through the policy-gradient term. Entropy bonus:
-entropy_coef * H.

Aggregation over tokens (``RLConfig.loss_agg``), with a normaliser the caller computes over the
whole step (:func:`step_normalizer`), so that splitting a step into micro-batches and summing
their losses gives the same loss and gradient as one big batch:
``token_mean`` sum of token terms / tokens in the step; ``seq_mean_token_sum`` sum of token terms
/ sequences in the step; ``seq_mean_token_mean`` each sequence's token mean, summed / sequences in
the step; ``seq_mean_token_sum_norm`` (Dr.GRPO as Liu et al. 2025 define it) sum of token terms /
a constant, ``max_response_tokens * sequences per step`` as configured, the same every step
whatever the responses' lengths or the filter kept (see ``losses.drgrpo_constant``).

Every metric is aggregated the same way, so metrics also sum over micro-batches to the step's
value. Keys: ``loss/total``, ``loss/pg``, ``loss/clip_frac``, ``loss/dual_clip_frac``,
``loss/ratio_mean``, ``loss/kl``, ``loss/entropy``, ``loss/tis_weight_mean``,
``loss/tis_clip_frac``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import get_args

import torch
from torch import Tensor

from megatron_rl.config.train import KLEstimator, LossAgg, RLConfig
from megatron_rl.packing.batch import PackedBatch, to_padded

LOSS_AGGS = list(get_args(LossAgg))
K3_CLAMP = 10.0  # upper bound of the per-token k3 estimate (nats), as verl's low_var_kl


def step_normalizer(masks: list[Tensor], agg: LossAgg, constant: float | None = None) -> float:
    """The normaliser of a whole step from its micro-batches' masks ([B_i, T_i] each).

    ``seq_mean_token_sum_norm`` needs ``constant`` (Dr.GRPO's fixed normaliser) and ignores the
    masks.
    """
    if agg == "seq_mean_token_sum_norm":
        if constant is None or constant <= 0:
            raise ValueError("rl.loss_agg=seq_mean_token_sum_norm needs a constant > 0")
        return float(constant)
    if agg == "token_mean":
        total = sum(float(m.sum()) for m in masks)
    else:
        total = float(sum(int((m.sum(dim=-1) > 0).sum()) for m in masks))
    return max(total, 1.0)


def aggregate(values: Tensor, mask: Tensor, agg: LossAgg, normalizer: float) -> Tensor:
    """Reduce per-token ``values`` [B, T] over ``mask`` [B, T] to a scalar (see module doc)."""
    mask = mask.to(values.dtype)
    if agg in ("token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm"):
        return (values * mask).sum() / normalizer
    if agg == "seq_mean_token_mean":
        per_seq = (values * mask).sum(dim=-1) / mask.sum(dim=-1).clamp(min=1)
        return per_seq.sum() / normalizer
    raise ValueError(f"rl.loss_agg={agg!r} is not known; choose one of {LOSS_AGGS}")


def kl_estimate(logp: Tensor, ref_logp: Tensor, estimator: KLEstimator) -> Tensor:
    """Per-token estimate of KL(pi || pi_ref) from tokens sampled from pi. [B, T] -> [B, T].

    The gradient each gives as a loss differs (module docstring): k1 none in expectation, k2
    that of KL(pi || pi_ref), k3 that of KL(pi_ref || pi); k3 is clamped to ``K3_CLAMP``.
    """
    x = ref_logp - logp
    if estimator == "k1":
        return -x
    if estimator == "k2":
        return 0.5 * x * x
    if estimator == "k3":
        return (torch.expm1(x) - x).clamp(max=K3_CLAMP)
    raise ValueError(f"rl.kl_estimator={estimator!r} is not known; choose one of k1, k2, k3")


def kl_reward_penalty(
    logp: Tensor, ref_logp: Tensor, mask: Tensor, coef: float, estimator: KLEstimator = "k1"
) -> Tensor:
    """Per-sequence penalty coef * sum_t KL_t, to subtract from rewards. [B, T] x3 -> [B].

    Use the rollout-time log-probs (no grad). k1 makes the penalised return an unbiased
    estimate of the KL-regularised objective; k2 and k3 are lower-variance but biased as a
    reward. The RL loop calls this (via ``controller/batches.kl_reward_penalties``) when
    ``rl.kl_in_reward`` is set.
    """
    kl = kl_estimate(logp.detach(), ref_logp.detach(), estimator)
    return coef * (kl * mask.to(kl.dtype)).sum(dim=-1)


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of each position's distribution. [B, T, V] -> [B, T] (fp32)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(dim=-1)


def _per_token_advantages(advantages: Tensor, like: Tensor) -> Tensor:
    """[B] or [B, T] advantages -> [B, T]."""
    if advantages.dim() == 1:
        return advantages[:, None].expand_as(like)
    if advantages.shape != like.shape:
        raise ValueError(
            f"advantages must be [B] or [B, T] = {tuple(like.shape)}, got {tuple(advantages.shape)}"
        )
    return advantages


@dataclass(frozen=True)
class Mismatch:
    """The train/inference mismatch |logp_trainer - logp_engine| over some tokens, in nats.

    Sums and token counts add, maxima max, over micro-batches and data-parallel ranks; the mean
    is taken last (``mismatch/logp_abs_mean`` = summed ``sum`` / summed ``tokens``).
    """

    sum: float  # summed over the tokens
    max: float  # the largest (0 without tokens)
    tokens: float  # tokens counted

    @property
    def mean(self) -> float:
        return self.sum / self.tokens if self.tokens else 0.0


def logp_mismatch(trainer_logp: Tensor, rollout_logp: Tensor, mask: Tensor) -> Mismatch:
    """|logp_trainer - logp_engine| on the tokens where ``mask`` is 1 (the sampled response
    tokens). ``trainer_logp``: the trainer's log-probs (detached here), ``rollout_logp``: what
    the engine returned for the same tokens, ``mask``: 0/1; one shape, packed [T] or padded
    [B, T]."""
    diff = (trainer_logp.detach() - rollout_logp.detach()).abs() * mask
    most = float(diff.max()) if diff.numel() else 0.0
    return Mismatch(sum=float(diff.sum()), max=most, tokens=float(mask.sum()))


def tis_weights(old_logp: Tensor, rollout_logp: Tensor, cap: float) -> tuple[Tensor, Tensor]:
    """Truncated IS weights min(pi_old / pi_rollout, cap) and where the cap bit. [B, T] each."""
    ratio = torch.exp(old_logp.detach() - rollout_logp.detach())
    return ratio.clamp(max=cap), ratio > cap


def policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float,
    clip_high: float,
    dual_clip: float | None = None,
    rollout_logp: Tensor | None = None,
    tis_cap: float | None = None,
    agg: LossAgg = "token_mean",
    normalizer: float,
) -> tuple[Tensor, dict[str, float]]:
    """Clipped policy-gradient loss. [B, T] inputs (advantages [B] or [B, T]) -> scalar.

    TIS applies when both ``rollout_logp`` and ``tis_cap`` are given.
    """
    adv = _per_token_advantages(advantages.to(logp.dtype), logp)
    ratio = torch.exp(logp - old_logp.detach())
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    per_token = torch.maximum(unclipped, clipped)
    clip_hit = (clipped > unclipped).to(logp.dtype)
    dual_hit = torch.zeros_like(per_token)
    if dual_clip is not None:
        cap = -adv * dual_clip
        dual_hit = ((adv < 0) & (per_token > cap)).to(logp.dtype)
        per_token = torch.where(adv < 0, torch.minimum(per_token, cap), per_token)
    tis_w = torch.ones_like(per_token)
    tis_hit = torch.zeros_like(per_token)
    if rollout_logp is not None and tis_cap is not None:
        tis_w, hit = tis_weights(old_logp, rollout_logp, tis_cap)
        tis_hit = hit.to(logp.dtype)
        per_token = per_token * tis_w
    loss = aggregate(per_token, mask, agg, normalizer)

    def agg_metric(x: Tensor) -> float:
        return float(aggregate(x.detach(), mask, agg, normalizer))

    metrics = {
        "loss/pg": float(loss.detach()),
        "loss/clip_frac": agg_metric(clip_hit),
        "loss/dual_clip_frac": agg_metric(dual_hit),
        "loss/ratio_mean": agg_metric(ratio),
        "loss/tis_weight_mean": agg_metric(tis_w),
        "loss/tis_clip_frac": agg_metric(tis_hit),
    }
    return loss, metrics


def rl_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    cfg: RLConfig,
    normalizer: float,
    *,
    rollout_logp: Tensor | None = None,
    ref_logp: Tensor | None = None,
    entropy: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """The full objective of :class:`RLConfig`: policy term + KL term - entropy bonus.

    ``logp``/``old_logp``/``rollout_logp``/``ref_logp``/``entropy``/``mask``: [B, T];
    ``advantages``: [B] or [B, T]; ``normalizer``: :func:`step_normalizer` of the whole step.
    ``ref_logp`` is required when ``cfg.kl_coef > 0`` and KL is a loss term; ``entropy``
    (e.g. :func:`entropy_from_logits`, with grad) when ``cfg.entropy_coef > 0``.
    """
    loss, metrics = policy_loss(
        logp,
        old_logp,
        advantages,
        mask,
        clip_low=cfg.clip_low,
        clip_high=cfg.clip_high,
        dual_clip=cfg.dual_clip,
        rollout_logp=rollout_logp,
        tis_cap=cfg.tis_cap,
        agg=cfg.loss_agg,
        normalizer=normalizer,
    )
    if ref_logp is not None:
        per_token_kl = kl_estimate(logp, ref_logp, cfg.kl_estimator)
        kl = aggregate(per_token_kl, mask, cfg.loss_agg, normalizer)
        metrics["loss/kl"] = float(kl.detach())
        if cfg.kl_coef > 0 and not cfg.kl_in_reward:
            loss = loss + cfg.kl_coef * kl
    elif cfg.kl_coef > 0 and not cfg.kl_in_reward:
        raise ValueError("rl.kl_coef > 0 with KL as a loss term needs ref_logp")
    if entropy is not None:
        ent = aggregate(entropy, mask, cfg.loss_agg, normalizer)
        metrics["loss/entropy"] = float(ent.detach())
        if cfg.entropy_coef:
            loss = loss - cfg.entropy_coef * ent
    elif cfg.entropy_coef:
        raise ValueError("rl.entropy_coef != 0 needs the per-token entropy")
    metrics["loss/total"] = float(loss.detach())
    return loss, metrics


def global_normalizer(
    shares: list[list[PackedBatch]], agg: str, constant: float | None = None
) -> float:
    """The step's loss normaliser over every DP share (tokens or sequences, by ``rl.loss_agg``;
    Dr.GRPO's ``constant`` for ``seq_mean_token_sum_norm``, see :func:`drgrpo_constant`)."""
    masks = [to_padded(b.loss_mask, b.cu_seqlens) for s in shares for b in s]
    return step_normalizer(masks, agg, constant)  # type: ignore[arg-type]


def drgrpo_constant(rl: RLConfig, max_new_tokens: int) -> float:
    """Dr.GRPO's fixed normaliser: max response tokens x sequences a step is configured for.

    Liu et al. 2025 divide each sequence's token sum by a constant (the generation budget) and
    average over the batch; with a fixed batch of ``prompts_per_step * group_size`` sequences
    that is one constant for every step, whatever the filter kept or the samples' lengths.
    ``max_new_tokens``: the engine's budget (``rollout.max_new_tokens``), used when
    ``rl.max_response_tokens`` is 0.
    """
    tokens = rl.max_response_tokens or max_new_tokens
    return float(tokens * rl.prompts_per_step * rl.group_size)
