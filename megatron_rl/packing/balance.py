"""Token-budget micro-batching balanced across data-parallel ranks.

A step's sequences (prompt + response, lengths in tokens) are split over ``dp_size`` ranks so that
every rank does about the same work, then each rank's share is cut into packed micro-batches of at
most ``budget`` tokens (:func:`megatron_rl.packing.batch.budget_bins`).

Rank assignment: the sequences are partitioned into ``dp_size`` sets of near-equal token count.
Two partitioners run and the one with the smaller spread (max - min rank load) wins:

- Karmarkar-Karp largest differencing, k-way (Karmarkar & Karp 1982; the multi-way form of
  Korf 2009): usually the best spread;
- greedy longest-first (LPT: each sequence, longest first, goes to the least-loaded rank).

Keeping LPT as a candidate gives a guarantee we test: the spread is at most the longest
sequence's length (LPT keeps ``max - min <= max item`` as an invariant), and never worse than LPT.

Cost model: loads are token counts, i.e. linear in length. Attention's quadratic term is not
modelled; for the sizes this trains (MLP-dominated at <= 32k tokens per sequence) the token count
is the quantity that decides step time. That is a deliberate simplification of e.g. verl's
sequence balancing, which also balances on token counts.

Equal micro-batch counts: ranks with fewer bins are padded with empty bins (``[]``) so that every
rank runs the same number of micro-batches (pipeline schedules and gradient all-reduce expect the
same count on every rank). An empty bin becomes :func:`dummy_batch`: one token with
``loss_mask = 0``, so it contributes exactly zero loss and zero gradient.

The log-prob pass and the training pass use the same rank assignment (log-probs computed on a rank
are consumed by training on that rank) but separate budgets: the log-prob pass keeps no
activations, so it can take larger micro-batches (``train.logprob_micro_batch_tokens``).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from megatron_rl.packing.batch import PackedBatch, budget_bins, pack

Plan = list[list[list[int]]]  # [rank][micro-batch] -> indices into the caller's sequence list


def _check_lengths(lengths: Sequence[int], dp_size: int) -> None:
    if dp_size < 1:
        raise ValueError(f"dp_size must be >= 1, got {dp_size}")
    bad = [i for i, n in enumerate(lengths) if n <= 0]
    if bad:
        raise ValueError(f"sequence lengths must be > 0; sequence {bad[0]} has {lengths[bad[0]]}")


def lpt_partition(lengths: Sequence[int], k: int) -> list[list[int]]:
    """Greedy longest-first: each index goes to the currently lightest of ``k`` sets."""
    heap = [(0, r) for r in range(k)]
    parts: list[list[int]] = [[] for _ in range(k)]
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        load, r = heapq.heappop(heap)
        parts[r].append(i)
        heapq.heappush(heap, (load + lengths[i], r))
    return parts


def kk_partition(lengths: Sequence[int], k: int) -> list[list[int]]:
    """k-way Karmarkar-Karp largest differencing on token counts.

    Each item starts as a k-tuple of sets (the item alone in the first set). Repeatedly the two
    tuples with the largest spread are merged, pairing the heaviest set of one with the lightest
    of the other, which cancels their spreads as far as possible.
    """
    # heap entries: (-spread, tiebreak, sums sorted descending, sets in the same order)
    heap: list[tuple[int, int, list[int], list[list[int]]]] = []
    for i, n in enumerate(lengths):
        sets = [[i]] + [[] for _ in range(k - 1)]
        heapq.heappush(heap, (-n, i, [n] + [0] * (k - 1), sets))
    tiebreak = len(lengths)
    while len(heap) > 1:
        _, _, sums_a, sets_a = heapq.heappop(heap)
        _, _, sums_b, sets_b = heapq.heappop(heap)
        merged = [(sums_a[j] + sums_b[k - 1 - j], sets_a[j] + sets_b[k - 1 - j]) for j in range(k)]
        merged.sort(key=lambda p: -p[0])
        sums = [s for s, _ in merged]
        heapq.heappush(heap, (sums[-1] - sums[0], tiebreak, sums, [s for _, s in merged]))
        tiebreak += 1
    return heap[0][3] if heap else [[] for _ in range(k)]


def spread(parts: Sequence[Sequence[int]], lengths: Sequence[int]) -> int:
    """max - min token load over the parts."""
    loads = [sum(lengths[i] for i in p) for p in parts]
    return max(loads) - min(loads)


def assign_ranks(lengths: Sequence[int], dp_size: int) -> list[list[int]]:
    """Split sequence indices over ``dp_size`` ranks with near-equal token totals.

    Returns ``dp_size`` sorted index lists; the better of Karmarkar-Karp and LPT (see module doc).
    """
    _check_lengths(lengths, dp_size)
    kk = kk_partition(lengths, dp_size)
    lpt = lpt_partition(lengths, dp_size)
    best = kk if spread(kk, lengths) <= spread(lpt, lengths) else lpt
    # Heaviest share first is arbitrary; sort for a deterministic rank order.
    best = sorted((sorted(p) for p in best), key=lambda p: (-sum(lengths[i] for i in p), p))
    return best


def bins_for_ranks(ranks: Sequence[Sequence[int]], lengths: Sequence[int], budget: int) -> Plan:
    """Cut each rank's share into bins of <= ``budget`` tokens; pad to equal bin counts with []."""
    plan: Plan = []
    for share in ranks:
        local = budget_bins([lengths[i] for i in share], budget) if share else []
        plan.append([[share[j] for j in b] for b in local])
    most = max((len(p) for p in plan), default=0)
    for p in plan:
        p.extend([] for _ in range(most - len(p)))
    return plan


def plan_microbatches(lengths: Sequence[int], budget: int, dp_size: int) -> Plan:
    """Per-rank lists of micro-batches (bins of sequence indices) for one pass.

    ``plan[r][m]`` are the indices packed into rank ``r``'s micro-batch ``m``. Every index appears
    exactly once; each bin holds <= ``budget`` tokens unless it is a single over-long sequence;
    every rank has the same number of bins (empty ones are dummies, see :func:`dummy_batch`).
    """
    return bins_for_ranks(assign_ranks(lengths, dp_size), lengths, budget)


@dataclass
class StepPlan:
    """Micro-batching of one optimizer step: one rank assignment, two budgets."""

    ranks: list[list[int]]  # [rank] -> sequence indices owned by that rank
    logprob: Plan  # micro-batches of the no-grad log-prob pass
    train: Plan  # micro-batches of the forward-backward pass


def plan_step(
    lengths: Sequence[int], dp_size: int, train_budget: int, logprob_budget: int
) -> StepPlan:
    """Plan both passes of a step with the same rank assignment and separate token budgets."""
    ranks = assign_ranks(lengths, dp_size)
    return StepPlan(
        ranks=ranks,
        logprob=bins_for_ranks(ranks, lengths, logprob_budget),
        train=bins_for_ranks(ranks, lengths, train_budget),
    )


def dummy_batch(pad_id: int = 0) -> PackedBatch:
    """The micro-batch an empty bin becomes: one pad token, nothing trained (loss_mask 0).

    Its ``seq_ids`` is empty: nothing from it scatters back to the caller.
    """
    return PackedBatch(
        tokens=torch.tensor([pad_id], dtype=torch.long),
        cu_seqlens=torch.tensor([0, 1], dtype=torch.int32),
        loss_mask=torch.zeros(1),
        position_ids=torch.zeros(1, dtype=torch.long),
        seq_ids=[],
    )


def build_batches(
    bins: Sequence[Sequence[int]],
    seqs: Sequence[Sequence[int]],
    loss_masks: Sequence[Sequence[float]],
    extras: dict[str, Sequence[Sequence[float]]] | None = None,
    pad_id: int = 0,
) -> list[PackedBatch]:
    """One rank's bins (``plan[rank]``) -> its packed micro-batches; empty bins become dummies.

    ``seq_ids`` of each batch are the caller's indices, so results scatter back with ``unpack``.
    """
    out = []
    for b in bins:
        if not b:
            out.append(dummy_batch(pad_id))
            continue
        picked: dict[str, Sequence[Sequence[float]]] = {
            k: [v[i] for i in b] for k, v in (extras or {}).items()
        }
        out.append(pack([seqs[i] for i in b], [loss_masks[i] for i in b], list(b), picked))
    return out


def padding_fraction(lengths: Sequence[int], rows: Sequence[Sequence[int]]) -> float:
    """Fraction of wasted tokens if each row is padded to its longest member (padded batching).

    ``rows`` are groups of indices forming [B, S_max] padded batches.
    """
    used = sum(lengths[i] for r in rows for i in r)
    total = sum(len(r) * max(lengths[i] for i in r) for r in rows if r)
    return 0.0 if total == 0 else 1.0 - used / total
