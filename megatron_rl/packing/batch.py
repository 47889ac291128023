"""Packed sequences: many variable-length sequences in one token row, no padding.

A :class:`PackedBatch` is the unit the trainer consumes for both the log-prob pass and the
training pass. Sequences are concatenated into one row of ``T`` tokens; ``cu_seqlens`` marks their
boundaries (the THD layout Megatron / Transformer Engine consume on GPUs); on CPUs the local
spec's varlen attention (``megatron_rl/model/attention.py``) reads the same ``cu_seqlens``.

Alignment convention used everywhere in megatron-rl: per-token tensors are aligned with
``tokens``: ``logprobs[t] = log p(tokens[t] | tokens[start(t):t])`` where ``start(t)`` is the first
token of t's sequence. The first token of every sequence has no prediction; its ``loss_mask`` is 0.

Shared-prefix packing (:func:`pack_groups`): the samples of a GRPO group share their prompt, so a
row holds each group's prompt once and then its members' responses, as separate *segments*:
``prompt[:-1]`` (the prefix segment), then per member ``[prompt[-1]] + response``. A response
segment attends to its group's whole prefix segment and causally to itself (``prefix_of`` names
the prefix segment), and its positions continue from the prompt's end (``position_ids``), so
every response token sees exactly the context and positions it has in its own sample. Starting
each response segment with a copy of the prompt's last token keeps the alignment convention
segment-local: the token that predicts a response's first token is in the same segment, so
log-probs, entropies, label shifts (CP) and loss masks work per segment as for plain packing.
The cost of a group falls from ``G * (p + r)`` tokens to ``p - 1 + G * (r + 1)``. The one value
that differs from plain packing: the log-prob of the prompt's last token (0 here, a segment
start), which no loss uses (prompt tokens are never trained).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class PackedBatch:
    """Sequences packed into one row.

    tokens:       [T] int64, all sequences back to back
    cu_seqlens:   [n + 1] int32, cu_seqlens[0] = 0, cu_seqlens[-1] = T
    loss_mask:    [T] float32, 1.0 on tokens that are trained (responses), else 0.0
    position_ids: [T] int64, each token's position in its sample: restarting at 0 at every
                  sequence start, continuing from the prompt's end in a response segment
    seq_ids:      index of each packed sequence in the caller's list (to scatter results back);
                  -1 for a shared prefix segment
    extras:       per-token float tensors [T] carried along (advantages, old log-probs, ...), or
                  [T, D] rows (an MoE's replayed routes), given to ``pack`` as tensors
    prefix_of:    per packed sequence, the index of the prefix segment it also attends to (in
                  full), or -1; empty: plain packing (every sequence attends to itself only)
    """

    tokens: torch.Tensor
    cu_seqlens: torch.Tensor
    loss_mask: torch.Tensor
    position_ids: torch.Tensor
    seq_ids: list[int] = field(default_factory=list)
    extras: dict[str, torch.Tensor] = field(default_factory=dict)
    prefix_of: list[int] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return int(self.tokens.numel())

    @property
    def num_seqs(self) -> int:
        return int(self.cu_seqlens.numel()) - 1

    def seq_lens(self) -> list[int]:
        return (self.cu_seqlens[1:] - self.cu_seqlens[:-1]).tolist()

    @property
    def shared_prefix(self) -> bool:
        """True when some sequence attends to a shared prefix segment (:func:`pack_groups`)."""
        return any(p >= 0 for p in self.prefix_of)


def pack(
    seqs: Sequence[Sequence[int]],
    loss_masks: Sequence[Sequence[float]],
    seq_ids: Sequence[int] | None = None,
    extras: Mapping[str, Sequence[Sequence[float]]] | None = None,
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
        list(batch.prefix_of),
    )


def group_tokens(lens: Sequence[int], prompt_len: int) -> int:
    """Tokens a group of sequences of ``lens`` takes in a row; shared when :func:`shares`."""
    if not shares(len(lens), prompt_len):
        return sum(lens)
    return prompt_len - 1 + sum(n - prompt_len + 1 for n in lens)


def shares(members: int, prompt_len: int) -> bool:
    """Whether a group is packed with a shared prefix: two or more members, a prompt of >= 2."""
    return members >= 2 and prompt_len >= 2


def group_bins(
    groups: Sequence[Sequence[int]], lens: Sequence[int], prompt_lens: Sequence[int], budget: int
) -> list[list[list[int]]]:
    """Rows of at most ``budget`` tokens, each a list of group chunks (lists of indices).

    A group that does not fit the budget is split into chunks of members (each chunk carries
    its own copy of the prompt); a chunk that still does not fit (one member) gets its own row.
    Chunks are binned first-fit decreasing by their shared-layout token count.
    """
    chunks: list[list[int]] = []
    for members in groups:
        p = prompt_lens[members[0]]
        chunk: list[int] = []
        for m in members:
            if chunk and group_tokens([lens[i] for i in [*chunk, m]], p) > budget:
                chunks.append(chunk)
                chunk = []
            chunk.append(m)
        if chunk:
            chunks.append(chunk)
    sizes = [group_tokens([lens[i] for i in c], prompt_lens[c[0]]) for c in chunks]
    return [[chunks[c] for c in b] for b in budget_bins(sizes, budget)]


def _check_group(
    seqs: Sequence[Sequence[int]],
    loss_masks: Sequence[Sequence[float]],
    extras: Mapping[str, Sequence[Sequence[float]]],
    members: Sequence[int],
    p: int,
) -> None:
    """Raise ValueError unless the members can share their first ``p`` tokens exactly."""
    first = members[0]
    for m in members:
        if len(seqs[m]) < p or list(seqs[m][:p]) != list(seqs[first][:p]):
            raise ValueError(f"pack_groups: sequence {m} does not start with its group's prompt")
        if any(float(x) != 0.0 for x in loss_masks[m][:p]):
            raise ValueError(f"pack_groups: sequence {m} trains prompt tokens (loss mask != 0)")
        for name, values in extras.items():
            if list(values[m][: p - 1]) != list(values[first][: p - 1]):
                raise ValueError(
                    f"pack_groups: extra {name!r} of sequence {m} differs from its group's on the "
                    "shared prompt; only values equal across a group can be shared"
                )


def pack_groups(
    seqs: Sequence[Sequence[int]],
    loss_masks: Sequence[Sequence[float]],
    groups: Sequence[Sequence[int]],
    prompt_lens: Sequence[int],
    extras: Mapping[str, Sequence[Sequence[float]]] | None = None,
) -> PackedBatch:
    """Shared-prefix packing of whole groups (see the module docstring) into one row.

    ``groups``: per group the indices (into ``seqs``, ``loss_masks``, ``prompt_lens`` and every
    extra's list) of its members, which start with the same ``prompt_lens[i]`` tokens. The
    result's ``seq_ids`` are those indices (-1 on prefix segments). A group of one member or a
    one-token prompt is packed as plain sequences.
    """
    extras = extras or {}
    rows: list[list[int]] = []
    masks: list[list[float]] = []
    pos: list[list[int]] = []
    ids: list[int] = []
    prefix_of: list[int] = []
    cols: dict[str, list[list[float]]] = {k: [] for k in extras}

    def segment(m: int, start: int, stop: int, prefix: int = -1, seq_id: int | None = None) -> None:
        """Tokens start..stop-1 of sequence m as one segment (positions as in the sample)."""
        rows.append(list(seqs[m][start:stop]))
        masks.append([0.0, *loss_masks[m][start + 1 : stop]])  # a segment start: no prediction
        pos.append(list(range(start, stop)))
        ids.append(m if seq_id is None else seq_id)
        prefix_of.append(prefix)
        for k, v in extras.items():
            cols[k].append([float(x) for x in v[m][start:stop]])

    for members in groups:
        p = prompt_lens[members[0]]
        if not shares(len(members), p):
            for m in members:
                segment(m, 0, len(seqs[m]))
            continue
        _check_group(seqs, loss_masks, extras, members, p)
        head = len(rows)
        segment(members[0], 0, p - 1, seq_id=-1)  # the shared prompt, but its last token
        for m in members:
            segment(m, p - 1, len(seqs[m]), prefix=head)
    batch = pack(rows, masks, seq_ids=ids, extras=cols)
    batch.position_ids = torch.tensor([x for row in pos for x in row], dtype=torch.long)
    batch.prefix_of = prefix_of
    return batch


def sample_rows(batch: PackedBatch) -> dict[int, torch.Tensor]:
    """Per caller index (``seq_ids`` >= 0), the row positions of its sample's tokens in order.

    For a response segment of a shared-prefix row these are its prefix segment's positions
    followed by its own, so ``values[rows[i]]`` is sample i's per-token tensor as plain packing
    would give it (except at the prompt's last token; see the module docstring).
    """
    cu = batch.cu_seqlens.tolist()
    prefix_of = batch.prefix_of or [-1] * batch.num_seqs
    out: dict[int, torch.Tensor] = {}
    for s, sid in enumerate(batch.seq_ids):
        if sid < 0:
            continue
        own = torch.arange(cu[s], cu[s + 1])
        head = prefix_of[s]
        out[sid] = own if head < 0 else torch.cat([torch.arange(cu[head], cu[head + 1]), own])
    return out


def to_padded(values: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """Packed per-token values [T] -> [n, L_max] (zeros past each sequence's end); keeps grad."""
    lens = cu_seqlens[1:] - cu_seqlens[:-1]
    width = int(lens.max())
    offs = torch.arange(width, device=values.device)
    idx = cu_seqlens[:-1, None].long() + offs[None, :]
    valid = offs[None, :] < lens[:, None]
    return torch.where(valid, values[idx.clamp(max=values.numel() - 1)], values.new_zeros(()))
