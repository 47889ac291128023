"""The controller's data plane without processes: DP shares by tokens, zero batches, hashes."""

from __future__ import annotations

import random

import pytest
import torch

from megatron_rl.controller.shares import pack_shares
from megatron_rl.model.config import ParallelConfig
from megatron_rl.train.data_plane import batch_hash, share_tokens
from megatron_rl.train.preflight import check_rl_layout


def groups(sizes: list[int], seed: int) -> tuple[list[list[int]], list[list[float]], dict]:
    """Sequences of mixed lengths in consecutive groups; extras mark the group and position."""
    rng = random.Random(seed)
    seqs, masks, adv, temp = [], [], [], []
    for g, n in enumerate(sizes):
        for _ in range(n):
            length = rng.randint(3, 40)
            seqs.append([rng.randrange(100) for _ in range(length)])
            masks.append([0.0] * 2 + [1.0] * (length - 2))
            adv.append([float(g)] * length)
            temp.append([0.7] * length)
    return seqs, masks, {"adv": adv, "temp": temp}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_shares_keep_groups_whole_balanced_and_equal_in_count(seed: int) -> None:
    sizes = [4] * 12
    seqs, masks, extras = groups(sizes, seed)
    shares = pack_shares(seqs, masks, extras, sizes, dp=3, budget=64)
    assert len(shares) == 3 and len({len(s) for s in shares}) == 1  # equal micro-batch counts
    seen: list[int] = []
    for share in shares:
        ids = [i for b in share for i in b.seq_ids]
        owned = {int(extras["adv"][i][0]) for i in ids}  # the groups this rank holds ...
        assert sorted(ids) == sorted(i for g in owned for i in range(4 * g, 4 * g + 4))  # whole
        seen += ids
        for b in share:
            assert b.num_tokens <= 64 or b.num_seqs == 1
    assert sorted(seen) == list(range(len(seqs)))  # every sequence exactly once
    tokens = [share_tokens(s) for s in shares]
    longest_group = max(sum(len(seqs[i]) for i in range(4 * g, 4 * g + 4)) for g in range(12))
    assert max(tokens) - min(tokens) <= longest_group
    assert sum(tokens) == sum(map(len, seqs))


def test_thin_step_pads_ranks_with_zero_weight_batches_carrying_every_extra() -> None:
    seqs, masks, extras = groups([4], seed=0)
    shares = pack_shares(seqs, masks, extras, [4], dp=2, budget=1000)
    full, empty = sorted(shares, key=share_tokens, reverse=True)
    assert share_tokens(full) == sum(map(len, seqs)) and share_tokens(empty) == 0
    assert len(empty) == len(full) == 1
    z = empty[0]
    assert z.seq_ids == [] and float(z.loss_mask.sum()) == 0.0 and z.num_tokens == 1
    # each extra as at a real sequence start: a temperature stays valid, an advantage is inert
    assert set(z.extras) == {"adv", "temp"} and float(z.extras["temp"][0]) == pytest.approx(0.7)


def test_no_sequences_gives_empty_shares() -> None:
    assert pack_shares([], [], {"adv": []}, [], dp=4, budget=8) == [[], [], [], []]


def test_batch_hash_sees_every_tensor_and_extra() -> None:
    seqs, masks, extras = groups([2, 2], seed=3)
    (a,) = pack_shares(seqs, masks, extras, [2, 2], dp=1, budget=1000)
    h = batch_hash(a)
    assert h == batch_hash(pack_shares(seqs, masks, extras, [2, 2], dp=1, budget=1000)[0])
    a[0].extras["temp"] = a[0].extras["temp"].clone()
    a[0].extras["temp"][-1] += 1e-3
    assert batch_hash(a) != h
    a[0].extras["extra"] = torch.zeros(a[0].num_tokens)
    assert batch_hash(a) != h


@pytest.mark.parametrize(
    ("parallel", "prompts", "world", "match"),
    [
        (ParallelConfig(dp=2, tp=2), 8, 2, r"parallel.dp \* parallel.tp .* = 4 is not the world"),
        (ParallelConfig(), 1, 2, r"rl.prompts_per_step=1 is below the data-parallel size 2"),
        (ParallelConfig(pp=2), 3, 16, r"rl.prompts_per_step=3 is below .* size 8"),
    ],
)
def test_bad_layout_is_one_line(parallel: ParallelConfig, prompts: int, world: int, match: str):
    with pytest.raises(ValueError, match=match) as err:
        check_rl_layout(parallel, prompts, world)
    assert "\n" not in str(err.value)


def test_good_layouts_pass() -> None:
    check_rl_layout(ParallelConfig(dp=2, tp=2), 2, 4)
    check_rl_layout(ParallelConfig(tp=2, pp=2), 1, 4)  # dp = 1
