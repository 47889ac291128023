"""Length-switched context parallelism: split only the micro-batches long enough to need it.

With ``parallel.cp > 1`` every rank of a CP group holds the same micro-batches. By default each
one is split over the group (``cp/shard.py``). With ``parallel.cp_min_tokens = N > 0`` a
micro-batch whose sequences are all shorter than ``N`` tokens is instead run *whole* by one rank
of the group, and the group's ranks share those micro-batches out between them: below the switch
point the CP group works as data parallelism, above it as context parallelism, in the same step
and with the same weights, optimizer and gradient reduction.

Why the gradient is right either way. Megatron's schedule multiplies every micro-batch loss by the
CP size and its DDP averages gradients over the data x context-parallel group. A split micro-batch
leaves each CP rank a share of the graph whose gradients add up to the whole (the factor cp turns
the average into that sum, as before). A whole micro-batch run by one rank gives that rank its
full gradient and the others nothing, and cp times the average over cp ranks is again exactly that
gradient. Each rank undoes the schedule's division by its own number of micro-batches. Losses are
normalised by the caller with step-wide counts, so nothing else changes.

Running a micro-batch whole means no CP collective inside it: the attention modules' CP group is
swapped for a group of this rank alone for the duration of its forward (:func:`unsplit`), which
turns megatron-core's THD RoPE and our CPU CP attention (``cp_attention.py``, which then runs the
per-sequence varlen kernel) into their single-rank forms, and on GPU sets Transformer Engine's
attention to no context parallelism (``set_context_parallel_group(None, ...)``; written to TE's
interface, not run here: no GPU). Backward passes reuse the groups saved at forward time, so the
swap need only cover the forward. Split micro-batches run collectives over the whole group in the
same order on every rank; whole ones run none, so ranks may hold different numbers of them.

Assignment (:func:`owners`): whole micro-batches go to the least-loaded CP rank by tokens, largest
first (LPT); a rank left with none runs one empty micro-batch so every rank takes part in the
step's gradient reduction. The per-micro-batch outputs are then exchanged over the CP group, so the
caller sees the outputs of every micro-batch on every rank, in order, as without the switch.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist

from megatron_rl.packing.batch import PackedBatch

SPLIT = -1  # owner of a micro-batch that is split over the whole CP group


def longest_sequence(batch: PackedBatch) -> int:
    return int((batch.cu_seqlens[1:] - batch.cu_seqlens[:-1]).max()) if batch.num_seqs else 0


def owners(batches: list[PackedBatch], min_tokens: int, cp: int) -> list[int]:
    """Per micro-batch: ``SPLIT``, or the CP rank that runs it whole (LPT by tokens).

    ``min_tokens <= 0`` or ``cp == 1``: every micro-batch is split (the switch is off).
    """
    if min_tokens <= 0 or cp == 1:
        return [SPLIT] * len(batches)
    out = [SPLIT] * len(batches)
    whole = [i for i, b in enumerate(batches) if longest_sequence(b) < min_tokens]
    load = [0] * cp
    for i in sorted(whole, key=lambda i: (-batches[i].num_tokens, i)):
        rank = min(range(cp), key=lambda r: (load[r], r))
        out[i] = rank
        load[rank] += batches[i].num_tokens
    return out


def empty_like(batch: PackedBatch) -> PackedBatch:
    """One token of ``batch`` with nothing trained: a rank's stand-in when it owns no work."""
    return PackedBatch(
        tokens=batch.tokens[:1].clone(),
        cu_seqlens=torch.tensor([0, 1], dtype=batch.cu_seqlens.dtype, device=batch.tokens.device),
        loss_mask=torch.zeros_like(batch.loss_mask[:1]),
        position_ids=torch.zeros_like(batch.position_ids[:1]),
        seq_ids=[],
        extras={k: v[:1].clone() for k, v in batch.extras.items()},
    )


class SoloGroups:
    """A process group of each rank alone (built once: ``new_group`` is collective)."""

    def __init__(self) -> None:
        world, me = dist.get_world_size(), dist.get_rank()
        self.group: Any = None
        for r in range(world):
            g = dist.new_group([r])
            if r == me:
                self.group = g
        self.rank = me


def _attention_modules(model: Any) -> Iterator[Any]:
    from megatron.core.transformer.attention import Attention

    for m in model.modules():
        if isinstance(m, Attention):
            yield m


@contextmanager
def unsplit(model: Any, solo: SoloGroups) -> Iterator[None]:
    """Within the block, the model's attention runs with a CP group of this rank alone."""
    saved: list[tuple[Any, str, Any]] = []
    te_saved: list[tuple[Any, tuple[Any, ...]]] = []
    try:
        for attn in _attention_modules(model):
            pgs = getattr(attn, "pg_collection", None)
            if pgs is not None and hasattr(pgs, "cp"):
                saved.append((pgs, "cp", pgs.cp))
                pgs.cp = solo.group
            core = attn.core_attention
            if hasattr(core, "set_context_parallel_group"):  # Transformer Engine (GPU)
                fields = ("cp_group", "cp_global_ranks", "cp_stream", "cp_comm_type")
                te_saved.append((core, tuple(getattr(core, f, None) for f in fields)))
                core.set_context_parallel_group(None, None, None, "p2p")
            elif hasattr(core, "cp_group"):  # megatron_rl/model/cp/attention.py (CPU)
                saved.append((core, "cp_group", core.cp_group))
                core.cp_group = solo.group
        yield
    finally:
        for obj, name, value in reversed(saved):
            setattr(obj, name, value)
        for core, (group, ranks, stream, comm) in te_saved:
            core.set_context_parallel_group(group, ranks, stream, comm or "p2p")


def exchange_outputs(outs: list[Any], order: list[int], owner: list[int], group: Any) -> list[Any]:
    """Every micro-batch's output on every CP rank, in micro-batch order.

    ``outs[k]`` is this rank's output of micro-batch ``order[k]`` (``order`` lists the micro-batches
    it ran, stand-ins as ``-1``); whole micro-batches' outputs come from their owners.
    """
    mine = {i: _to_cpu(o) for i, o in zip(order, outs, strict=True) if i >= 0}
    gathered: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(
        gathered, {i: o for i, o in mine.items() if owner[i] != SPLIT}, group=group
    )
    merged = {i: o for part in gathered for i, o in part.items()}
    merged.update({i: o for i, o in mine.items() if owner[i] == SPLIT})
    return [merged[i] for i in range(len(owner))]


def _to_cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    return value
