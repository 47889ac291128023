"""Context parallelism: the load-balanced causal split of packed (THD) batches, and its inverse.

With context parallelism (CP) of degree ``cp`` every sequence is spread over ``cp`` ranks. Under a
causal mask late tokens attend to more keys than early ones, so a contiguous split would give the
last rank most of the work. The balanced split (Megatron / Transformer Engine convention) cuts each
sequence into ``2 * cp`` equal chunks and gives rank ``r`` chunks ``r`` and ``2*cp - 1 - r``: an
early and a late chunk, whose causal costs add up to the same total on every rank.

Packed batches are split per sequence: each sequence of the packed row is padded at its end to a
multiple of ``2 * cp`` (TE's THD CP kernels require it) and then split as above; a rank's local row
is, for each sequence in order, its first chunk then its second chunk. This reproduces TE's
``thd_get_partitioned_indices`` (checked against it in the GPU test).

Labels are shifted before splitting. The project convention (``packing/batch.py``) aligns
per-token values with the token they score: ``logprobs[t]`` needs the logits at ``t - 1``, which
may sit on another CP rank. So :func:`shard` gives each rank ``labels[t] = tokens[t + 1]`` (the next
token in the same sequence) and every per-token input (loss mask, advantages, old log-probs)
shifted the same way; a rank then computes everything locally, and :func:`to_token_aligned` shifts
gathered results back. Pad positions and each sequence's last token have ``label_mask = 0``.

Loss gathering: with a global normaliser ``N`` (the response tokens of the whole step), each rank's
loss is ``sum(local per-token loss * label_mask) / N``. The per-rank losses add up to the unsplit
loss, and so do their gradients once summed over the CP group (Megatron's DDP reduces gradients
over the data-parallel x context-parallel group; if it averages there, the caller multiplies by
the group size). For logging, :func:`all_reduce_sum` adds the local sums.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from megatron_rl.packing.batch import PackedBatch


def check_cp_supported(cp: int) -> None:
    """Raise ``ValueError`` when ``cp > 1`` cannot run here.

    On CPU, CP runs with ``megatron_rl/model/cp/attention.py``. On GPU the CP path is Transformer
    Engine's attention, so there (and only there) CP needs Transformer Engine.
    """
    if cp < 1:
        raise ValueError(f"parallel.cp must be >= 1, got {cp}")
    have_te = importlib.util.find_spec("transformer_engine") is not None
    if cp > 1 and torch.cuda.is_available() and not have_te:
        raise ValueError(
            f"parallel.cp={cp} on GPU needs Transformer Engine (the GPU context-parallel "
            "attention is transformer_engine's); install transformer_engine or set parallel.cp=1"
        )


def padded_len(n: int, cp: int) -> int:
    """Length ``n`` rounded up to a multiple of ``2 * cp``."""
    unit = 2 * cp
    return -(-n // unit) * unit


@dataclass
class CPLayout:
    """Where every token of a packed row goes under CP.

    cu_seqlens:        [n + 1] int32, real sequence boundaries of the packed row (T tokens)
    cu_seqlens_padded: [n + 1] int32, boundaries after padding each sequence to 2*cp multiples
    src:               [T_pad] int64, for each padded position its token index in the real row,
                       or -1 on padding
    rank_index:        cp tensors [T_pad / cp] int64, positions of the padded row on each rank
    """

    cp: int
    cu_seqlens: torch.Tensor
    cu_seqlens_padded: torch.Tensor
    src: torch.Tensor
    rank_index: list[torch.Tensor] = field(default_factory=list)

    @property
    def padded_tokens(self) -> int:
        return int(self.cu_seqlens_padded[-1])

    @property
    def local_tokens(self) -> int:
        return self.padded_tokens // self.cp


def make_layout(cu_seqlens: torch.Tensor, cp: int) -> CPLayout:
    """Build the CP layout of a packed row from its ``cu_seqlens`` ([n + 1])."""
    if cp < 1:
        raise ValueError(f"cp must be >= 1, got {cp}")
    cu = cu_seqlens.to(torch.int64).cpu()
    lens = (cu[1:] - cu[:-1]).tolist()
    plens = [padded_len(n, cp) for n in lens]
    cu_pad = torch.zeros(len(lens) + 1, dtype=torch.int64)
    cu_pad[1:] = torch.cumsum(torch.tensor(plens, dtype=torch.int64), 0)
    src = torch.full((int(cu_pad[-1]),), -1, dtype=torch.int64)
    for s, n in enumerate(lens):
        start = int(cu_pad[s])
        src[start : start + n] = torch.arange(int(cu[s]), int(cu[s]) + n)
    rank_index = []
    for r in range(cp):
        parts = []
        for s, pl in enumerate(plens):
            c = pl // (2 * cp)
            base = int(cu_pad[s])
            parts.append(torch.arange(base + r * c, base + (r + 1) * c))
            parts.append(torch.arange(base + (2 * cp - 1 - r) * c, base + (2 * cp - r) * c))
        rank_index.append(torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64))
    return CPLayout(cp, cu.to(torch.int32), cu_pad.to(torch.int32), src, rank_index)


def to_padded(values: torch.Tensor, layout: CPLayout, fill: float | int = 0) -> torch.Tensor:
    """Scatter a real-row tensor [T, ...] into the padded row [T_pad, ...] (``fill`` on pads)."""
    out = values.new_full((layout.padded_tokens, *values.shape[1:]), fill)
    keep = layout.src >= 0
    out[keep] = values[layout.src[keep]]
    return out


def next_token_view(
    values: torch.Tensor, cu_seqlens: torch.Tensor, fill: float | int = 0
) -> torch.Tensor:
    """Shift per-token values one step left inside each sequence: out[t] = values[t + 1].

    The last position of every sequence gets ``fill``. values: [T, ...] -> [T, ...].
    """
    out = values.new_full(values.shape, fill)
    out[:-1] = values[1:]
    ends = cu_seqlens[1:].long() - 1
    out[ends] = fill
    return out


def to_token_aligned(
    next_values: torch.Tensor, cu_seqlens: torch.Tensor, fill: float = 0.0
) -> torch.Tensor:
    """Inverse of :func:`next_token_view`: out[t] = next_values[t - 1]; sequence starts: fill."""
    out = next_values.new_full(next_values.shape, fill)
    out[1:] = next_values[:-1]
    out[cu_seqlens[:-1].long()] = fill
    return out


@dataclass
class CPShard:
    """One CP rank's part of a packed batch (all per-token tensors [L], L = T_pad / cp).

    tokens:       input token ids
    labels:       next token in the same sequence (pad_id where there is none)
    label_mask:   1.0 where ``labels`` is a trained token (the loss mask, shifted), else 0.0
    position_ids: position of each token inside its own sequence
    extras:       the batch's per-token extras, shifted like the labels
    layout:       the full-row layout (same on every rank), for reassembly and TE's cu_seqlens
    """

    tokens: torch.Tensor
    labels: torch.Tensor
    label_mask: torch.Tensor
    position_ids: torch.Tensor
    extras: dict[str, torch.Tensor]
    layout: CPLayout


def shard(batch: PackedBatch, cp: int, rank: int, pad_id: int = 0) -> CPShard:
    """Rank ``rank``'s share of ``batch`` under the load-balanced causal split."""
    if not 0 <= rank < cp:
        raise ValueError(f"CP rank must be in [0, {cp}), got {rank}")
    layout = make_layout(batch.cu_seqlens, cp)
    cu = batch.cu_seqlens
    idx = layout.rank_index[rank]
    pos = torch.arange(layout.padded_tokens) - torch.repeat_interleave(
        layout.cu_seqlens_padded[:-1].long(),
        (layout.cu_seqlens_padded[1:] - layout.cu_seqlens_padded[:-1]).long(),
    )

    def local(values: torch.Tensor, fill: float | int) -> torch.Tensor:
        return to_padded(values, layout, fill)[idx]

    labels = next_token_view(batch.tokens, cu, fill=pad_id)
    return CPShard(
        tokens=local(batch.tokens, pad_id),
        labels=local(labels, pad_id),
        label_mask=local(next_token_view(batch.loss_mask, cu), 0.0),
        position_ids=pos[idx],
        extras={k: local(next_token_view(v, cu), 0.0) for k, v in batch.extras.items()},
        layout=layout,
    )


def merge(per_rank: list[torch.Tensor], layout: CPLayout) -> torch.Tensor:
    """Reassemble per-rank local tensors ([L, ...] each, rank order) into the real row [T, ...]."""
    if len(per_rank) != layout.cp:
        raise ValueError(f"merge: got {len(per_rank)} rank tensors for cp={layout.cp}")
    first = per_rank[0]
    padded = first.new_zeros((layout.padded_tokens, *first.shape[1:]))
    for r, values in enumerate(per_rank):
        padded[layout.rank_index[r]] = values
    return padded[layout.src >= 0]


def all_gather_merge(local: torch.Tensor, layout: CPLayout, group: Any = None) -> torch.Tensor:
    """All-gather a local per-token tensor over the CP group and reassemble it (no grad)."""
    parts = [torch.empty_like(local) for _ in range(layout.cp)]
    dist.all_gather(parts, local.detach().contiguous(), group=group)
    return merge(parts, layout)


def all_reduce_sum(value: torch.Tensor, group: Any = None) -> torch.Tensor:
    """Sum a (detached) scalar such as a local loss sum over the CP group, for logging."""
    out = value.detach().clone()
    dist.all_reduce(out, op=dist.ReduceOp.SUM, group=group)
    return out


class _GatherRow(torch.autograd.Function):
    """All-gather a local per-token tensor over CP and merge it into the real row, with grad.

    Every CP rank then computes the same function of the whole row (the loss), so the gradient
    reaching a rank's local values is simply its own entries of the row's gradient.
    """

    @staticmethod
    def forward(
        ctx: Any, local: torch.Tensor, layout: CPLayout, rank: int, group: Any
    ) -> torch.Tensor:
        ctx.layout, ctx.rank = layout, rank
        return all_gather_merge(local, layout, group=group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        layout: CPLayout = ctx.layout
        padded = to_padded(grad, layout)
        return padded[layout.rank_index[ctx.rank].to(grad.device)], None, None, None


def gather_token_aligned(
    local_next: torch.Tensor, part: CPShard, rank: int, group: Any = None
) -> torch.Tensor:
    """This rank's next-token values [L] -> the whole row [T] in token alignment, differentiable.

    ``local_next[i]`` scores ``part.labels[i]``; the result ``out[t]`` scores ``tokens[t]`` (0 at
    sequence starts), as the unsplit policy returns it. Pad positions are dropped.
    """
    merged: torch.Tensor = _GatherRow.apply(local_next, part.layout, rank, group)
    return to_token_aligned(merged, part.layout.cu_seqlens.to(merged.device))


def check_same_batches(batches: list[PackedBatch], group: Any = None) -> None:
    """Raise ``ValueError`` unless every CP rank holds the same packed batches.

    Under CP every rank must start from the whole batch (each takes its own share); a loop that
    hands CP ranks different data would otherwise train on a mix of rows. Compares a cheap
    signature (lengths, boundaries, token and mask checksums) of every batch over the group.
    """
    rows: list[list[float]] = []
    for b in batches:
        tok = b.tokens.detach().to("cpu", torch.float64)
        weights = torch.arange(1, tok.numel() + 1, dtype=torch.float64)
        cu = b.cu_seqlens.detach().to("cpu", torch.float64)
        mask = b.loss_mask.detach().to("cpu", torch.float64)
        sums = [float((tok * weights).sum()), float(cu.pow(2).sum()), float(mask.sum())]
        rows.append([float(b.num_tokens), float(b.num_seqs), *sums])
    mine = torch.tensor(rows or [[0.0] * 5], dtype=torch.float64).flatten()
    size = torch.tensor([mine.numel()], dtype=torch.int64)
    sizes = [torch.zeros_like(size) for _ in range(dist.get_world_size(group))]
    dist.all_gather(sizes, size, group=group)
    if any(int(s) != int(size) for s in sizes):
        raise ValueError("context-parallel ranks got different numbers of micro-batches")
    parts = [torch.empty_like(mine) for _ in sizes]
    dist.all_gather(parts, mine, group=group)
    if any(not torch.equal(p, mine) for p in parts):
        raise ValueError(
            "context-parallel ranks got different micro-batches; every rank of a CP group must "
            "be given the same packed batches (each rank takes its own share of them)"
        )
