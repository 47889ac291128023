"""Packed sequences: many variable-length sequences in one token row, no padding.

A :class:`PackedBatch` is the unit the trainer consumes for both the log-prob pass and the
training pass. Sequences are concatenated into one row of ``T`` tokens; ``cu_seqlens`` marks their
boundaries (the THD layout Megatron / Transformer Engine consume on GPUs). On CPUs (local attention
spec, no TE) the model builds a block-diagonal causal mask from the same ``cu_seqlens``.

Alignment convention used everywhere in megatron-rl: per-token tensors are aligned with
``tokens``: ``logprobs[t] = log p(tokens[t] | tokens[start(t):t])`` where ``start(t)`` is the first
token of t's sequence. The first token of every sequence has no prediction; its ``loss_mask`` is 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class PackedBatch:
    """Sequences packed into one row.

    tokens:       [T] int64, all sequences back to back
    cu_seqlens:   [n + 1] int32, cu_seqlens[0] = 0, cu_seqlens[-1] = T
    loss_mask:    [T] float32, 1.0 on tokens that are trained (responses), else 0.0
    position_ids: [T] int64, restarting at 0 at every sequence start
    seq_ids:      index of each packed sequence in the caller's list (to scatter results back)
    extras:       per-token float tensors [T] carried along (advantages, old log-probs, ...), or
                  [T, D] rows (an MoE's replayed routes), given to ``pack`` as tensors
    """

    tokens: torch.Tensor
    cu_seqlens: torch.Tensor
    loss_mask: torch.Tensor
    position_ids: torch.Tensor
    seq_ids: list[int] = field(default_factory=list)
    extras: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def num_tokens(self) -> int:
        return int(self.tokens.numel())

    @property
    def num_seqs(self) -> int:
        return int(self.cu_seqlens.numel()) - 1

    def seq_lens(self) -> list[int]:
        return (self.cu_seqlens[1:] - self.cu_seqlens[:-1]).tolist()


def pack(
    seqs: Sequence[Sequence[int]],
    loss_masks: Sequence[Sequence[float]],
    seq_ids: Sequence[int] | None = None,
    extras: dict[str, Sequence[Sequence[float]]] | None = None,
) -> PackedBatch:
    """Concatenate sequences (each a list of token ids, with a same-length loss mask)."""
    if len(seqs) != len(loss_masks):
        raise ValueError(f"pack: {len(seqs)} sequences but {len(loss_masks)} loss masks")
    lens = [len(s) for s in seqs]
    for i, (s, m) in enumerate(zip(seqs, loss_masks, strict=True)):
        if len(s) != len(m):
            raise ValueError(f"pack: sequence {i} has {len(s)} tokens but {len(m)} mask entries")
        if len(s) == 0:
            raise ValueError(f"pack: sequence {i} is empty")
    cu = torch.zeros(len(seqs) + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(torch.tensor(lens, dtype=torch.int32), 0)
    tokens = torch.tensor([t for s in seqs for t in s], dtype=torch.long)
    mask = torch.tensor([float(x) for m in loss_masks for x in m], dtype=torch.float32)
    starts = torch.repeat_interleave(cu[:-1].long(), torch.tensor(lens))
    pos = torch.arange(tokens.numel(), dtype=torch.long) - starts
    mask[cu[:-1].long()] = 0.0  # the first token of a sequence has no prediction
    packed_extras: dict[str, torch.Tensor] = {}
    for name, values in (extras or {}).items():
        if values and isinstance(values[0], torch.Tensor):  # per-token rows [n, D] per sequence
            packed = torch.cat([torch.as_tensor(v, dtype=torch.float32) for v in values])
        else:
            packed = torch.tensor([float(x) for v in values for x in v], dtype=torch.float32)
        if packed.shape[0] != tokens.numel():
            raise ValueError(
                f"pack: extra {name!r} has {packed.shape[0]} entries for {tokens.numel()}"
            )
        packed_extras[name] = packed
    ids = list(seq_ids) if seq_ids is not None else list(range(len(seqs)))
    return PackedBatch(tokens, cu, mask, pos, ids, packed_extras)


def unpack(values: torch.Tensor, batch: PackedBatch) -> list[torch.Tensor]:
    """Split a per-token tensor [T, ...] back into one tensor per packed sequence."""
    return list(torch.split(values, batch.seq_lens()))


def budget_bins(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Group sequence indices into bins of at most ``budget`` tokens (first-fit decreasing).

    A sequence longer than the budget gets a bin of its own (it cannot be split here).
    """
    if budget <= 0:
        raise ValueError(f"token budget must be > 0, got {budget}")
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    bins: list[list[int]] = []
    loads: list[int] = []
    for i in order:
        for b, load in enumerate(loads):
            if load + lengths[i] <= budget:
                bins[b].append(i)
                loads[b] += lengths[i]
                break
        else:
            bins.append([i])
            loads.append(lengths[i])
    return [sorted(b) for b in bins]


def to_device(batch: PackedBatch, device: Any) -> PackedBatch:
    """Move every tensor of the batch to ``device``."""
    return PackedBatch(
        batch.tokens.to(device),
        batch.cu_seqlens.to(device),
        batch.loss_mask.to(device),
        batch.position_ids.to(device),
        list(batch.seq_ids),
        {k: v.to(device) for k, v in batch.extras.items()},
    )
