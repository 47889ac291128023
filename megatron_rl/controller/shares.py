"""DP shares by tokens: the controller packs every DP rank's micro-batches once per step.

Partitioning (:func:`pack_shares`): the kept groups (a group stays whole on one rank, its
advantages are relative to each other) are split over the DP ranks with near-equal token totals
by ``megatron_rl.packing.balance.assign_ranks`` (Karmarkar-Karp or LPT, whichever spreads less);
each rank's share is then packed into micro-batches under the token budget, and ranks short of
micro-batches get zero-weight ones (:func:`zero_batch`), so every rank runs the same number of
forward/backward passes. Shipping the shares is :mod:`megatron_rl.train.data_plane`.
"""

from __future__ import annotations

from typing import Any

import torch

from megatron_rl.packing.balance import assign_ranks, dummy_batch
from megatron_rl.packing.batch import (
    PackedBatch,
    budget_bins,
    group_bins,
    group_tokens,
    pack,
    pack_groups,
)

Extras = dict[str, list[list[float]]]


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
    (``packing.batch.pack_groups``: each group's prompt once, a group over the budget split
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
