"""The data plane of a distributed RL step: DP shares by tokens, shipping, lockstep, reductions.

The controller (global rank 0, see ``controller.py``) builds every DP rank's micro-batches once
per step; :func:`ship` hands each rank its share over the CPU control group
(``parallel.control_group``, gloo: it works beside NCCL training too). Every rank of one
TP/PP/CP group gets the same pickled share, so their micro-batches are byte-identical;
:func:`check_lockstep` proves it each step (a hash all-gather) and fails loudly instead of
letting differing batches deadlock a collective.

Partitioning (:func:`pack_shares`): the kept groups (a group stays whole on one rank, its
advantages are relative to each other) are split over the DP ranks with near-equal token totals
by ``long_context.balance.assign_ranks`` (Karmarkar-Karp or LPT, whichever spreads less). Each
share is cut into micro-batches of at most ``budget`` tokens, with each group's prompt once when
packed with shared prefixes (``train.shared_prefix``). Ranks get the same number of
micro-batches: the missing ones, and a whole share when a thin step has fewer groups than DP
ranks, are zero-weight micro-batches (one pad token, loss mask 0, each extra as at a real
sequence's first token: every extra of the step is carried, whatever its name), so every rank
takes part in the step's collectives and contributes exactly zero gradient.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from long_context.balance import assign_ranks, dummy_batch
from long_context.packing import (
    PackedBatch,
    budget_bins,
    group_bins,
    group_tokens,
    pack,
    pack_groups,
)
from megatron_rl.model.parallel import DistInfo, control_group

Extras = dict[str, list[list[float]]]


@dataclass
class StepWork:
    """What one rank trains on in a step (shipped by the controller)."""

    batches: list[PackedBatch]  # this rank's micro-batches (zero-weight ones on a thin step)
    normalizer: float  # the step's loss normaliser summed over every DP share (rl.loss_agg)
    train: bool  # False when no group at all was kept: every rank skips the update
    info: dict[str, Any] = field(default_factory=dict)  # e.g. {"tokens": per-DP-rank tokens}


def zero_batch(fill: dict[str, Any], pad_id: int = 0) -> PackedBatch:
    """A micro-batch that trains nothing: one pad token, loss mask 0, extras set to ``fill``.

    ``fill`` gives each extra the value a real sequence has at its first token (a sequence start,
    like this one), so per-token inputs such as a temperature stay in their valid range (a
    per-token row, such as replayed routes, gives a ``[1, D]`` extra).
    """
    b = dummy_batch(pad_id)
    b.extras = {k: torch.as_tensor(v, dtype=torch.float32)[None] for k, v in fill.items()}
    return b


def pack_rows(
    seqs: list[list[int]],
    masks: list[list[float]],
    extras: Extras,
    groups: list[list[int]],
    budget: int,
    prompt_lens: list[int] | None = None,
) -> list[PackedBatch]:
    """Micro-batches of at most ``budget`` tokens holding the samples of ``groups`` (indices).

    With ``prompt_lens`` (per sample) the groups are packed with shared prefixes
    (``long_context.packing.pack_groups``: each group's prompt once, a group over the budget split
    into chunks of members); without, one sequence per sample (first-fit decreasing).
    """
    if prompt_lens is not None:
        lens = [len(s) for s in seqs]
        return [
            pack_groups(seqs, masks, chunks, prompt_lens, extras)
            for chunks in group_bins(groups, lens, prompt_lens, budget)
        ]
    idx = [i for g in groups for i in g]
    bins = budget_bins([len(seqs[i]) for i in idx], budget) if idx else []
    return [
        pack(
            [seqs[idx[j]] for j in b],
            [masks[idx[j]] for j in b],
            seq_ids=[idx[j] for j in b],
            extras={k: [v[idx[j]] for j in b] for k, v in extras.items()},
        )
        for b in bins
    ]


def pack_shares(
    seqs: list[list[int]],
    masks: list[list[float]],
    extras: Extras,
    group_sizes: list[int],
    dp: int,
    budget: int,
    prompt_lens: list[int] | None = None,
) -> list[list[PackedBatch]]:
    """Per DP rank, packed micro-batches of its groups; equal counts (zero batches pad).

    ``seqs`` are grouped consecutively: the first ``group_sizes[0]`` belong to group 0, etc.
    ``prompt_lens`` (per sample): pack with shared prefixes (:func:`pack_rows`), and balance the
    ranks by the tokens of that layout. Returns ``[[] ...]`` (dp empty lists) when there is no
    sequence at all.
    """
    if not seqs:
        return [[] for _ in range(dp)]
    starts = [sum(group_sizes[:g]) for g in range(len(group_sizes))]
    members = [list(range(s, s + n)) for s, n in zip(starts, group_sizes, strict=True)]
    if prompt_lens is None:
        tokens = [sum(len(seqs[i]) for i in m) for m in members]
    else:
        tokens = [group_tokens([len(seqs[i]) for i in m], prompt_lens[m[0]]) for m in members]
    shares = [
        pack_rows(seqs, masks, extras, [members[g] for g in groups], budget, prompt_lens)
        for groups in assign_ranks(tokens, dp)
    ]
    most = max(len(s) for s in shares)
    fill = {k: v[0][0] for k, v in extras.items()}  # what a sequence start carries
    for s in shares:
        s.extend(zero_batch(fill) for _ in range(most - len(s)))
    return shares


def share_tokens(share: list[PackedBatch]) -> int:
    """Tokens a share trains on (zero-weight micro-batches count 0)."""
    return sum(b.num_tokens for b in share if b.seq_ids)


def rank_to_dp(info: DistInfo) -> list[int]:
    """DP rank of every global rank (collective over the control group; once per run)."""
    if info.world_size == 1:
        return [0]
    table: list[Any] = [None] * info.world_size
    dist.all_gather_object(table, info.dp_rank, group=control_group())
    return [int(x) for x in table]


def ship(
    shares: list[list[PackedBatch]] | None,
    normalizer: float,
    info: DistInfo,
    dp_of: list[int],
) -> StepWork:
    """Controller: send each rank its DP share (plus the step normaliser); others: receive it.

    Only global rank 0 passes ``shares`` (one list per DP rank); the others pass ``None``.
    """
    if info.rank == 0:
        assert shares is not None and len(shares) == info.dp, "one share per DP rank"
        train = any(shares)
        tokens = [share_tokens(s) for s in shares]
        works = [StepWork(s, normalizer, train, {"tokens": tokens}) for s in shares]
        if info.world_size == 1:
            return works[0]
        objs: list[Any] | None = [works[dp_of[r]] for r in range(info.world_size)]
    else:
        objs = None
    out: list[Any] = [None]
    dist.scatter_object_list(out, objs, src=0, group=control_group())
    return out[0]


def batch_hash(batches: list[PackedBatch]) -> str:
    """sha256 over every tensor of the micro-batches (tokens, offsets, mask, positions, extras)
    and their shared-prefix structure."""
    h = hashlib.sha256()
    for b in batches:
        tensors = [b.tokens, b.cu_seqlens, b.loss_mask, b.position_ids]
        tensors += [b.extras[k] for k in sorted(b.extras)]
        for t in tensors:
            h.update(t.detach().cpu().contiguous().numpy().tobytes())
        h.update(repr((sorted(b.extras), b.prefix_of)).encode())
    return h.hexdigest()


def check_lockstep(batches: list[PackedBatch], info: DistInfo, dp_of: list[int]) -> str:
    """Raise unless every rank of each TP/PP/CP group holds the same micro-batches; their hash."""
    mine = batch_hash(batches)
    if info.world_size == 1:
        return mine
    hashes: list[Any] = [None] * info.world_size
    dist.all_gather_object(hashes, mine, group=control_group())
    for r, h in enumerate(hashes):
        first = dp_of.index(dp_of[r])
        if h != hashes[first]:
            raise RuntimeError(
                f"ranks {first} and {r} (DP rank {dp_of[r]}) hold different micro-batches; "
                "the ranks of one TP/PP/CP group must train on identical batches"
            )
    return mine


def dp_reduce(sums: dict[str, float], maxes: dict[str, float], info: DistInfo) -> dict[str, float]:
    """Sum ``sums`` and take the max of ``maxes`` over the data-parallel group."""
    out = {**sums, **maxes}
    if info.dp == 1:
        return out
    from megatron.core import parallel_state as mpu

    group = mpu.get_data_parallel_group()
    for values, op in ((sums, dist.ReduceOp.SUM), (maxes, dist.ReduceOp.MAX)):
        keys = sorted(values)
        if not keys:
            continue
        t = torch.tensor([values[k] for k in keys], dtype=torch.float64, device=info.device)
        dist.all_reduce(t, op=op, group=group)
        out.update(zip(keys, t.cpu().tolist(), strict=True))
    return out


def agree_any(flag: bool) -> bool:
    """True on every rank if any rank passes True (e.g. a preemption signal seen by one rank)."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return flag
    t = torch.tensor([int(flag)])
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=control_group())
    return bool(t.item())


def check_rl_layout(parallel: Any, prompts_per_step: int, world_size: int) -> None:
    """Start-up check, before anything is written: the layout fits and every DP rank has data."""
    from megatron_rl.model.parallel import validate_layout

    validate_layout(parallel, world_size, None)
    dp = world_size // (parallel.tp * parallel.pp * parallel.cp)
    if prompts_per_step < dp:
        raise ValueError(
            f"rl.prompts_per_step={prompts_per_step} is below the data-parallel size "
            f"{dp} (world {world_size} / (parallel.tp * parallel.pp * parallel.cp)); "
            f"use rl.prompts_per_step >= {dp} so every DP rank can get a group"
        )
