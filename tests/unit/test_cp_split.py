"""Context-parallel split of packed batches (long_context/cp.py): pure logic, on CPU."""

from __future__ import annotations

import importlib.util
import random

import pytest
import torch

from megatron_rl.model.cp.shard import (
    check_cp_supported,
    make_layout,
    merge,
    next_token_view,
    shard,
    to_token_aligned,
)
from megatron_rl.packing.batch import pack


def random_batch(lens: list[int], seed: int = 0):
    rng = random.Random(seed)
    seqs = [[rng.randrange(1, 100) for _ in range(n)] for n in lens]
    masks = [[float(i >= n // 3) for i in range(n)] for n in lens]
    adv = [[rng.uniform(-1, 1)] * n for n in lens]
    return pack(seqs, masks, extras={"advantages": adv})


@pytest.mark.parametrize("cp", [1, 2, 3, 4])
def test_round_trip_every_token_exactly_once(cp: int) -> None:
    batch = random_batch([7, 1, 16, 33, 2], seed=cp)
    shards = [shard(batch, cp, r, pad_id=0) for r in range(cp)]
    layout = shards[0].layout
    assert all(s.tokens.numel() == layout.local_tokens for s in shards)
    assert torch.equal(merge([s.tokens for s in shards], layout), batch.tokens)
    assert torch.equal(merge([s.position_ids for s in shards], layout), batch.position_ids)
    # every padded position is owned by exactly one rank
    owned = torch.cat(layout.rank_index).sort().values
    assert torch.equal(owned, torch.arange(layout.padded_tokens))


@pytest.mark.parametrize("cp", [2, 3])
def test_one_sequence_matches_megatrons_get_batch_on_this_cp_rank(
    cp: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without padding, the split is megatron-core's (0.16.1 ``utils.get_batch_on_this_cp_rank``:
    2 * cp chunks, rank r keeps chunks r and 2cp-1-r) for tokens, labels and positions."""
    from megatron.core import utils as mcore_utils

    n = 2 * cp * 5
    batch = random_batch([n], seed=cp)
    labels = torch.cat([batch.tokens[1:], torch.zeros(1, dtype=torch.long)])  # shifted, pad 0
    monkeypatch.setattr(mcore_utils, "get_pg_size", lambda group=None: cp)
    for r in range(cp):
        monkeypatch.setattr(mcore_utils, "get_pg_rank", lambda group=None, r=r: r)
        full = {"tokens": batch.tokens[None], "labels": labels[None],
                "position_ids": batch.position_ids[None]}  # fmt: skip
        theirs = mcore_utils.get_batch_on_this_cp_rank(full, cp_group=object())
        part = shard(batch, cp, r, pad_id=0)
        assert torch.equal(theirs["tokens"][0], part.tokens)
        assert torch.equal(theirs["labels"][0], part.labels)
        assert torch.equal(theirs["position_ids"][0], part.position_ids)


@pytest.mark.parametrize("cp", [2, 3])
def test_padding_is_out_of_the_loss(cp: int) -> None:
    """Pads (each sequence topped up to a multiple of 2 * cp) carry label_mask 0, and the loss
    mask of the real tokens survives the split: the shards' masks sum to the batch's."""
    batch = random_batch([5, 1, 10, 3], seed=3)
    shards = [shard(batch, cp, r, pad_id=7) for r in range(cp)]
    layout = shards[0].layout
    assert layout.padded_tokens > batch.num_tokens  # there is padding to mask
    for r, part in enumerate(shards):
        is_pad = layout.src[layout.rank_index[r]] < 0
        assert bool(is_pad.any())  # the 1-token sequence leaves pads on every rank
        assert float(part.label_mask[is_pad].abs().sum()) == 0.0
        assert bool((part.tokens[is_pad] == 7).all())
    assert sum(float(p.label_mask.sum()) for p in shards) == float(batch.loss_mask.sum())


@pytest.mark.parametrize("cp", [2, 4])
def test_sequences_padded_to_multiples_of_2cp(cp: int) -> None:
    batch = random_batch([5, 8, 9])
    layout = make_layout(batch.cu_seqlens, cp)
    plens = (layout.cu_seqlens_padded[1:] - layout.cu_seqlens_padded[:-1]).tolist()
    assert plens == [-(-n // (2 * cp)) * (2 * cp) for n in (5, 8, 9)]


def test_known_chunk_assignment_cp2() -> None:
    # One sequence of 8 tokens, cp=2 -> 4 chunks of 2: rank 0 gets chunks 0,3; rank 1 gets 1,2.
    batch = pack([list(range(10, 18))], [[1.0] * 8])
    s0, s1 = shard(batch, 2, 0), shard(batch, 2, 1)
    assert s0.tokens.tolist() == [10, 11, 16, 17]
    assert s1.tokens.tolist() == [12, 13, 14, 15]
    assert s0.position_ids.tolist() == [0, 1, 6, 7]
    assert s0.labels.tolist() == [11, 12, 17, 0]  # last token has no next token
    assert s0.label_mask.tolist() == [1.0, 1.0, 1.0, 0.0]


@pytest.mark.parametrize("cp", [2, 3, 4])
def test_causal_work_is_equal_on_every_rank(cp: int) -> None:
    # Causal attention cost of a token ~ (its position + 1) keys. With padding included,
    # the early+late chunk pairing gives every rank exactly the same total, per sequence.
    batch = random_batch([4 * cp * 3, 2 * cp * 5])
    costs = [int((shard(batch, cp, r).position_ids + 1).sum()) for r in range(cp)]
    assert len(set(costs)) == 1
    # ...whereas a contiguous split would not be balanced.
    n = batch.num_tokens
    contiguous = [
        int((batch.position_ids[r * n // cp : (r + 1) * n // cp] + 1).sum()) for r in range(cp)
    ]
    assert len(set(contiguous)) > 1


@pytest.mark.parametrize("cp", [1, 2, 3])
def test_loss_gathering_matches_unsplit_loss(cp: int) -> None:
    torch.manual_seed(cp)
    batch = random_batch([9, 4, 20, 13], seed=1)
    vocab = 100
    logits = torch.randn(batch.num_tokens, vocab)  # stands in for a model's output per position
    # Unsplit reference in the project convention: logprobs[t] = log p(tokens[t] | prefix).
    lp_next = torch.log_softmax(logits, -1).gather(
        1, next_token_view(batch.tokens, batch.cu_seqlens).unsqueeze(1)
    )[:, 0]
    ref_lp = to_token_aligned(lp_next, batch.cu_seqlens)
    n_tokens = batch.loss_mask.sum()
    ref_loss = -(ref_lp * batch.extras["advantages"] * batch.loss_mask).sum() / n_tokens

    layout = make_layout(batch.cu_seqlens, cp)
    padded_logits = torch.zeros(layout.padded_tokens, vocab)
    keep = layout.src >= 0
    padded_logits[keep] = logits[layout.src[keep]]
    local_losses, local_lps = [], []
    for r in range(cp):
        s = shard(batch, cp, r)
        lg = padded_logits[layout.rank_index[r]]  # what rank r's model would output
        lp = torch.log_softmax(lg, -1).gather(1, s.labels.unsqueeze(1))[:, 0]
        local_lps.append(lp)
        local_losses.append(-(lp * s.extras["advantages"] * s.label_mask).sum() / n_tokens)
    assert torch.allclose(sum(local_losses), ref_loss, atol=1e-6)
    gathered = to_token_aligned(merge(local_lps, layout), batch.cu_seqlens)
    assert torch.allclose(gathered * batch.loss_mask, ref_lp * batch.loss_mask, atol=1e-6)


def test_bad_rank_and_degree() -> None:
    batch = random_batch([4])
    with pytest.raises(ValueError, match="CP rank"):
        shard(batch, 2, 2)
    with pytest.raises(ValueError, match="parallel.cp must be >= 1"):
        check_cp_supported(0)


def test_check_cp_supported_refuses_only_gpu_without_te(monkeypatch: pytest.MonkeyPatch) -> None:
    """CP runs on CPU (long_context/cp_attention.py); on GPU its attention is TE's (issue 17)."""
    check_cp_supported(1)  # always fine
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    check_cp_supported(2)  # CPU: no Transformer Engine needed
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "transformer_engine" else real_find_spec(name, *a),
    )
    with pytest.raises(ValueError, match="parallel.cp=2 on GPU needs Transformer Engine"):
        check_cp_supported(2)
