"""Advantages -> packed micro-batches -> GRPO-family loss -> one optimizer step.

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

Every token carries the temperature its sample was drawn at (``extras["temp"]``): groups of
different domains sample at different temperatures and share micro-batches, and the policy,
entropy and reference are all scored per token at that temperature, as the engine sampled.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import replace
from typing import Any

import torch

from long_context.packing import PackedBatch
from megatron_rl.model.gpt import TEMPERATURE_KEY, use_te_spec
from megatron_rl.model.moe import ROUTES_KEY, pop_aux_losses, routes_extra
from megatron_rl.train.advantages import compute_advantages
from megatron_rl.train.dist_batches import dp_reduce, pack_rows, pack_shares
from megatron_rl.train.losses import kl_reward_penalty, rl_loss, step_normalizer
from megatron_rl.train.optim import lr_at
from megatron_rl.train.rollout_phase import Group, Sample

log = logging.getLogger(__name__)


def to_padded(values: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """Packed per-token values [T] -> [n, L_max] (zeros past each sequence's end); keeps grad."""
    lens = cu_seqlens[1:] - cu_seqlens[:-1]
    width = int(lens.max())
    offs = torch.arange(width, device=values.device)
    idx = cu_seqlens[:-1, None].long() + offs[None, :]
    valid = offs[None, :] < lens[:, None]
    return torch.where(valid, values[idx.clamp(max=values.numel() - 1)], values.new_zeros(()))


def _rows(
    groups: list[Group], kept: list[int], advantages: torch.Tensor | None
) -> tuple[list[list[int]], list[list[float]], dict[str, list[list[float]]], list[int]]:
    """Token ids, loss masks, per-token extras and prompt lengths of every kept sample, in order.

    Extras: ``rollout_lp`` (engine log-probs, 0 on prompt/env tokens), ``temp`` (the temperature
    the sample was drawn at, on every token: the trainer scores each token at it), when
    ``advantages`` [len(kept), n] is given, ``adv`` (each sample's advantage on its response),
    and when the engine returned them (routing replay), ``routes`` (:func:`sample_routes`).
    """
    seqs, masks, prompt_lens = [], [], []
    extras: dict[str, list[Any]] = {"rollout_lp": [], TEMPERATURE_KEY: []}
    if advantages is not None:
        extras["adv"] = []
    samples = [s for i in kept for s in groups[i].samples]
    if samples and all(s.routed_experts is not None for s in samples):
        extras[ROUTES_KEY] = [sample_routes(s) for s in samples]
    for gi, i in enumerate(kept):
        temp = float(groups[i].spec.temperature)
        for si, s in enumerate(groups[i].samples):
            p = len(s.prompt_ids)
            seqs.append(s.prompt_ids + s.response_ids)
            masks.append([0.0] * p + s.response_mask)
            prompt_lens.append(p)
            extras["rollout_lp"].append([0.0] * p + s.rollout_logprobs)
            extras[TEMPERATURE_KEY].append([temp] * (p + len(s.response_ids)))
            if advantages is not None:
                extras["adv"].append([0.0] * p + [float(advantages[gi, si])] * len(s.response_ids))
    return seqs, masks, extras, prompt_lens


def shared_prefix_enabled(requested: bool, routing_replay: bool = False) -> bool:
    """``train.shared_prefix`` where the trainer's attention supports it, else False.

    Shared-prefix rows need the local layer spec (varlen attention with a prefix segment and
    per-token RoPE, ``megatron_rl/model/attention.py``); with Transformer Engine's spec (GPU)
    the step packs one sequence per sample instead, and says so once. So does a run whose
    engine returns expert routes (``routing_replay``: ``rl.routing_replay: rollout`` or
    ``rollout.return_routed_experts``): they ride in ``extras["routes"]`` as per-token rows,
    which ``pack_groups`` does not share yet.
    """
    if not requested:
        return False
    if routing_replay:
        log.warning(
            "train.shared_prefix: expert routes (rl.routing_replay: rollout or "
            "rollout.return_routed_experts) are not shared by pack_groups yet; packing one "
            "sequence per sample"
        )
        return False
    if use_te_spec():
        log.warning(
            "train.shared_prefix: Transformer Engine's attention has no shared-prefix path yet "
            "(docs/long_context.md); packing one sequence per sample"
        )
        return False
    return True


def sample_routes(s: Sample) -> torch.Tensor:
    """A sample's replayed routing as per-token rows ``[P + R, L * k]`` (``extras["routes"]``).

    The engine ran every token but the last (``[P + R - 1, L, k]``); the last token's row (its
    output predicts nothing that is trained) gets experts ``0 .. k-1`` in every layer.
    """
    routes = torch.as_tensor(s.routed_experts)
    n = len(s.prompt_ids) + len(s.response_ids)
    if routes.dim() != 3 or routes.shape[0] != n - 1:
        raise ValueError(
            f"routed experts of a {s.domain} sample have shape {tuple(routes.shape)}; expected "
            f"[{n - 1}, layers, top-k] for {len(s.prompt_ids)} prompt + {len(s.response_ids)} "
            "response tokens"
        )
    last = torch.arange(routes.shape[2]).expand(1, routes.shape[1], -1)
    return routes_extra(torch.cat([routes.long(), last]))


def build_batches(
    groups: list[Group],
    kept: list[int],
    estimator: str,
    budget: int,
    dp: int = 1,
    reward_penalty: torch.Tensor | None = None,
    shared_prefix: bool = False,
) -> tuple[list[list[PackedBatch]], dict[str, float]]:
    """Per DP rank, packed micro-batches of its kept groups, with advantages and engine log-probs.

    Advantages are computed once over all kept groups, from the rewards minus ``reward_penalty``
    [len(kept), n] if given (the KL penalty of :func:`kl_reward_penalties`); the groups are then
    split over ``dp`` ranks balanced by tokens (``dist_batches.pack_shares``: a group stays
    whole; ranks short of micro-batches get zero-weight ones), each group's prompt packed once
    with ``shared_prefix`` (see :func:`shared_prefix_enabled`). Every token carries its
    sample's sampling temperature (``extras["temp"]``), so the trainer's log-probs, entropy and
    reference log-probs are those of the distribution the engine sampled from.
    """
    rewards = torch.tensor(
        [[s.reward for s in groups[i].samples] for i in kept], dtype=torch.float64
    )
    if reward_penalty is not None and kept:
        rewards = rewards - reward_penalty.to(rewards.dtype)
    advantages = compute_advantages(rewards, estimator) if kept else rewards
    seqs, masks, extras, prompt_lens = _rows(groups, kept, advantages)
    sizes = [len(groups[i].samples) for i in kept]
    plens = prompt_lens if shared_prefix else None
    shares = pack_shares(seqs, masks, extras, sizes, dp, budget, plens)
    stats = {"train/advantage_abs_mean": float(advantages.abs().mean()) if kept else 0.0}
    if reward_penalty is not None and kept:
        stats["train/shaped_reward_mean"] = float(rewards.mean())  # after the KL penalty
    return shares, stats


def kl_reward_penalties(
    ref: Any,
    groups: list[Group],
    kept: list[int],
    rl: Any,
    budget: int,
    shared_prefix: bool = False,
) -> tuple[torch.Tensor, dict[str, float]]:
    """KL to the reference as a reward penalty (``rl.kl_in_reward``): [len(kept), n] and metrics.

    Per sample: ``rl.kl_coef * sum_t KL_t`` over its policy tokens, with the estimator
    ``rl.kl_estimator`` evaluated on the engine's log-probs (the policy that sampled) against the
    reference's at the same temperature (no gradient: it is part of the reward). With ``k1``
    the penalised return is an unbiased estimate of the KL-regularised objective. Runs on the
    controller alone, so the reference must not be split over ranks (checked at start-up).
    A sample's policy tokens all lie in its own (response) segment, so the per-segment sums
    scatter back by ``seq_ids`` (prefix segments, -1, carry none).
    """
    seqs, masks, extras, prompt_lens = _rows(groups, kept, None)
    n = len(groups[kept[0]].samples)
    members = [list(range(g * n, (g + 1) * n)) for g in range(len(kept))]
    plens = prompt_lens if shared_prefix else None
    batches = pack_rows(seqs, masks, extras, members, budget, plens)
    flat = torch.zeros(len(seqs), dtype=torch.float64)
    for b, (ref_lp, _) in zip(batches, ref.token_logprobs(batches), strict=True):
        cu = b.cu_seqlens
        pen = kl_reward_penalty(
            to_padded(b.extras["rollout_lp"], cu),
            to_padded(ref_lp.float(), cu),
            to_padded(b.loss_mask, cu),
            rl.kl_coef,
            rl.kl_estimator,
        )
        ids = torch.tensor(b.seq_ids)
        flat[ids[ids >= 0]] = pen[ids >= 0].double()
    stats = {
        "train/kl_penalty_mean": float(flat.mean()),
        "train/kl_penalty_max": float(flat.abs().max()),
    }
    return flat.view(len(kept), n), stats


def global_normalizer(
    shares: list[list[PackedBatch]], agg: str, constant: float | None = None
) -> float:
    """The step's loss normaliser over every DP share (tokens or sequences, by ``rl.loss_agg``;
    Dr.GRPO's ``constant`` for ``seq_mean_token_sum_norm``, see :func:`drgrpo_constant`)."""
    masks = [to_padded(b.loss_mask, b.cu_seqlens) for s in shares for b in s]
    return step_normalizer(masks, agg, constant)  # type: ignore[arg-type]


def drgrpo_constant(cfg: Any) -> float:
    """Dr.GRPO's fixed normaliser: max response tokens x sequences a step is configured for.

    Liu et al. 2025 divide each sequence's token sum by a constant (the generation budget) and
    average over the batch; with a fixed batch of ``prompts_per_step * group_size`` sequences
    that is one constant for every step, whatever the filter kept or the samples' lengths.
    """
    rl = cfg.rl
    tokens = rl.max_response_tokens or cfg.rollout.max_new_tokens
    return float(tokens * rl.prompts_per_step * rl.group_size)


def train_step(
    policy: Any,
    cfg: Any,
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
        norm = global_normalizer([batches], rl.loss_agg, drgrpo_constant(cfg))
    for b, ref in zip(batches, ref_logprobs or [], strict=False):
        b.extras["ref_lp"] = ref.detach().float()  # travels with the batch to the last stage

    def loss_fn(
        b: PackedBatch, logp: torch.Tensor, ent: torch.Tensor | None
    ) -> tuple[torch.Tensor, dict[str, float]]:
        cu = b.cu_seqlens
        pad = lambda x: to_padded(x, cu)  # noqa: E731
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
        diff = (logp.detach() - b.extras["rollout_lp"]).abs() * b.loss_mask
        m["mismatch_sum"] = float(diff.sum())
        m["mismatch_max"] = float(diff.max()) if diff.numel() else 0.0
        m["tokens"] = float(b.loss_mask.sum())
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


def _compare_replay(rl: Any, batches: list[PackedBatch], step: int) -> bool:
    """Measure the mismatch without routing replay this step (every rank decides alike)."""
    every = rl.replay_mismatch_every
    replayed = bool(batches) and ROUTES_KEY in batches[0].extras
    return replayed and every > 0 and step % every == 0


def _mismatch_without_replay(policy: Any, batches: list[PackedBatch]) -> dict[str, float]:
    """|logp_trainer - logp_engine| on trained tokens with the trainer routing freely: sum, max."""
    free = [replace(b, extras={k: v for k, v in b.extras.items() if k != ROUTES_KEY})
            for b in batches]  # fmt: skip
    total, most = 0.0, 0.0
    for b, (lp, _) in zip(batches, policy.token_logprobs(free), strict=True):
        diff = (lp - b.extras["rollout_lp"]).abs() * b.loss_mask
        total += float(diff.sum())
        most = max(most, float(diff.max()) if diff.numel() else 0.0)
    return {"sum": total, "max": most}


def _skip(policy: Any) -> dict[str, float]:
    """A NaN/inf loss: drop this step's gradients, keep the weights, count it."""
    policy.zero_grad()
    return {"grad_norm": float("nan"), "lr": 0.0, "skipped": 1.0}
