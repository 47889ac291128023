"""Kept groups -> advantages -> packed micro-batches per DP rank (the controller's half of a step).

Advantages are computed once over every kept group, then the groups are split over the DP ranks
by tokens (:mod:`megatron_rl.controller.shares`). Every token carries the temperature its sample
was drawn at (``extras["temp"]``): groups of different domains sample at different temperatures
and share micro-batches, and the policy, entropy and reference are all scored per token at that
temperature, as the engine sampled. With ``rl.kl_in_reward`` the KL to the reference is a reward
penalty computed here, before the advantages. The trainer ranks' half is
:mod:`megatron_rl.train.step`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import torch

from megatron_rl.controller.advantages import compute_advantages
from megatron_rl.controller.shares import pack_rows, pack_shares
from megatron_rl.losses import kl_reward_penalty
from megatron_rl.model.gpt import TEMPERATURE_KEY, use_te_spec
from megatron_rl.model.moe import ROUTES_KEY, routes_extra
from megatron_rl.packing.batch import PackedBatch, to_padded
from megatron_rl.rollout.groups import Group, Sample

if TYPE_CHECKING:
    from megatron_rl.config.train import RLConfig

log = logging.getLogger(__name__)


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
    split over ``dp`` ranks balanced by tokens (``controller/shares.pack_shares``: a group stays
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
    rl: RLConfig,
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
