"""The data plane between the controller (global rank 0) and the trainer ranks.

The controller ships each rank its data-parallel share of a step (:func:`ship`); every rank
checks that the ranks of one TP/PP/CP group hold identical micro-batches (:func:`check_lockstep`)
and agrees on stop signals (:func:`agree_any`); metrics are reduced over DP (:func:`dp_reduce`).
All of it goes over the CPU control group (:func:`megatron_rl.model.parallel.control_group`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from megatron_rl.model.parallel import DistInfo, control_group
from megatron_rl.packing.batch import (
    PackedBatch,
)


@dataclass
class StepWork:
    """What one rank trains on in a step (shipped by the controller)."""

    batches: list[PackedBatch]  # this rank's micro-batches (zero-weight ones on a thin step)
    normalizer: float  # the step's loss normaliser summed over every DP share (rl.loss_agg)
    train: bool  # False when no group at all was kept: every rank skips the update
    info: dict[str, Any] = field(default_factory=dict)  # e.g. {"tokens": per-DP-rank tokens}


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
