"""GRPO-family loss over this rank's packed micro-batches -> one optimizer step (trainer ranks).

One optimizer step per rollout batch (on-policy): the "old" policy of the PPO ratio is the
policy the step starts from, so its log-probs come from the same forward pass, detached (the
ratio is exactly 1 and its gradient is the policy gradient). The engine's log-probs enter through
truncated importance sampling (``rl.tis_cap``), which corrects the train/inference mismatch and,
in off-policy mode, the staleness of samples made by an older policy. The mismatch itself
(|logp_trainer - logp_engine| on sampled tokens) is measured in the same pass, so it is free.
With routing replay (MoE, ``rl.routing_replay: rollout``) every forward replays the engine's
expert choices (``extras["routes"]``), the reference's included; every
``rl.replay_mismatch_every`` steps one extra forward-only pass over the same batch without
replay logs what the mismatch would have been (``mismatch/logp_abs_*_no_replay``).

The batches come from the controller (:mod:`megatron_rl.controller.batches`).
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from megatron_rl.losses import (
    drgrpo_constant,
    global_normalizer,
    logp_mismatch,
    rl_loss,
)
from megatron_rl.model.moe import ROUTES_KEY, pop_aux_losses
from megatron_rl.packing.batch import PackedBatch, to_padded
from megatron_rl.train.data_plane import dp_reduce
from megatron_rl.train.optim import lr_at

if TYPE_CHECKING:
    from megatron_rl.config import RunConfig
    from megatron_rl.config.train import RLConfig
    from megatron_rl.model.policy import Policy


def train_step(
    policy: Policy,
    cfg: RunConfig,
    batches: list[PackedBatch],
    step: int,
    ref_logprobs: list[torch.Tensor] | None = None,
    normalizer: float | None = None,
) -> dict[str, float]:
    """Forward/backward over this rank's micro-batches and one optimizer step; returns metrics.

    ``normalizer``: the step's loss normaliser summed over every DP share (the controller's
    ``global_normalizer``); None: this rank's batches are the whole step. Megatron DDP averages
    gradients over DP, so each rank's loss is scaled by the DP size: DP=k then gives the gradient
    of one rank training on all k shares. Metrics are reduced over DP (sums summed, maxima maxed)
    and are the same on every rank.
    """
    rl = cfg.rl
    dp = policy.dist.dp
    norm = normalizer
    if norm is None:
        constant = drgrpo_constant(rl, cfg.rollout.max_new_tokens)
        norm = global_normalizer([batches], rl.loss_agg, constant)
    for b, ref in zip(batches, ref_logprobs or [], strict=False):
        b.extras["ref_lp"] = ref.detach().float()  # travels with the batch to the last stage

    def loss_fn(
        b: PackedBatch, logp: torch.Tensor, ent: torch.Tensor | None
    ) -> tuple[torch.Tensor, dict[str, float]]:
        cu = b.cu_seqlens
        pad = lambda x: to_padded(x, cu)
        mask, lp, rlp = pad(b.loss_mask), pad(logp), pad(b.extras["rollout_lp"])
        ref = b.extras.get("ref_lp")
        loss, m = rl_loss(
            lp,
            lp.detach(),
            pad(b.extras["adv"]),
            mask,
            rl,
            norm,
            rollout_logp=rlp,
            ref_logp=pad(ref) if ref is not None else None,
            entropy=pad(ent) if ent is not None else None,
        )
        mm = logp_mismatch(logp, b.extras["rollout_lp"], b.loss_mask)
        m["mismatch_sum"], m["mismatch_max"], m["tokens"] = mm.sum, mm.max, mm.tokens
        return loss * dp, m

    t0 = time.time()
    # the same batch without routing replay: what the mismatch would be (same weights)
    free = _mismatch_without_replay(policy, batches) if _compare_replay(rl, batches, step) else {}
    outs = policy.forward_backward(batches, loss_fn)
    sums = {k: sum(o[k] for o in outs) for k in outs[0] if k.startswith("loss/")} if outs else {}
    sums.update(
        loss=sum(o["loss"] for o in outs) / dp,
        tokens=sum(o["tokens"] for o in outs),
        mismatch_sum=sum(o["mismatch_sum"] for o in outs),
        packed_tokens=float(sum(b.num_tokens for b in batches if b.seq_ids)),
    )
    maxes = {"mismatch_max": max((o["mismatch_max"] for o in outs), default=0.0)}
    if free:
        sums["free_sum"], maxes["free_max"] = free["sum"], free["max"]
    red = dp_reduce(sums, maxes, policy.dist)
    loss = red["loss"]  # the same on every rank, so every rank skips or steps alike
    opt = policy.optimizer_step(lr_at(step, cfg.train)) if math.isfinite(loss) else _skip(policy)
    dt = time.time() - t0
    metrics = {k: v for k, v in red.items() if k.startswith("loss/")}
    metrics.update(
        {
            "loss/total": loss,
            "train/grad_norm": opt["grad_norm"],
            "train/lr": opt["lr"],
            "train/skipped_steps": opt["skipped"],
            "train/nan_loss": float(not math.isfinite(loss)),
            "mismatch/logp_abs_mean": red["mismatch_sum"] / max(red["tokens"], 1.0),
            "mismatch/logp_abs_max": red["mismatch_max"],
            "perf/train_s": dt,
            "perf/trained_tokens_per_s": red["packed_tokens"] / max(dt, 1e-9),
            "perf/response_tokens_per_s": red["tokens"] / max(dt, 1e-9),
            "train/response_tokens": red["tokens"],
        }
    )
    if policy.cfg.is_moe:  # the router's aux / z-losses (their gradients are in the step)
        metrics.update(pop_aux_losses(len(batches)))
    if free:
        metrics["mismatch/logp_abs_mean_no_replay"] = red["free_sum"] / max(red["tokens"], 1.0)
        metrics["mismatch/logp_abs_max_no_replay"] = red["free_max"]
    return metrics


def _compare_replay(rl: RLConfig, batches: list[PackedBatch], step: int) -> bool:
    """Measure the mismatch without routing replay this step (every rank decides alike)."""
    every = rl.replay_mismatch_every
    replayed = bool(batches) and ROUTES_KEY in batches[0].extras
    return replayed and every > 0 and step % every == 0


def _mismatch_without_replay(policy: Policy, batches: list[PackedBatch]) -> dict[str, float]:
    """|logp_trainer - logp_engine| on trained tokens with the trainer routing freely: sum, max."""
    free = [
        replace(b, extras={k: v for k, v in b.extras.items() if k != ROUTES_KEY}) for b in batches
    ]
    total, most = 0.0, 0.0
    for b, (lp, _) in zip(batches, policy.token_logprobs(free), strict=True):
        mm = logp_mismatch(lp, b.extras["rollout_lp"], b.loss_mask)
        total, most = total + mm.sum, max(most, mm.max)
    return {"sum": total, "max": most}


def _skip(policy: Policy) -> dict[str, float]:
    """A NaN/inf loss: drop this step's gradients, keep the weights, count it."""
    policy.zero_grad()
    return {"grad_norm": float("nan"), "lr": 0.0, "skipped": 1.0}
