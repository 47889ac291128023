"""Varlen core attention for packed rows without Transformer Engine (the CPU path).

A packed row holds several sequences back to back (``megatron_rl/packing/batch.PackedBatch``).
On GPU,
Transformer Engine's ``TEDotProductAttention`` takes the row in the THD layout with Megatron's
``PackedSeqParams`` (``cu_seqlens``) and attends within each sequence. megatron-core's local
``DotProductAttention`` refuses ``PackedSeqParams`` and needs a dense ``[T, T]`` block-diagonal
mask, so its cost grows with T² although only sum_i s_i² scores are ever used.

:class:`VarlenDotProductAttention` is the local spec's core attention with the THD interface of
TE: given ``packed_seq_params`` (``qkv_format="thd"``) it calls :func:`varlen_attention`, which
runs ``scaled_dot_product_attention`` with ``is_causal`` on sequences padded only to the longest
of their length bucket (sequences of similar length share one call). Without packed params it is
megatron-core's ``DotProductAttention``, mask and all.

Exactness: padding is on the right and attention is causal, so a real query never sees a pad
key; pad queries' outputs are dropped, so no gradient flows through pads. RoPE is applied by
megatron-core before the core attention, with positions restarting at 0 in every sequence (its
``_apply_rotary_pos_emb_thd``), exactly as on the TE path.

:func:`varlen_attention` is a plain function of tensors so other core attentions (context
parallelism) can call it on their own shards.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch
import torch.nn.functional as F
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.transformer.dot_product_attention import DotProductAttention
from torch import Tensor

from megatron_rl.packing.batch import PackedBatch

# Sequences whose length is within this factor of their bucket's longest share one padded SDPA
# call: padding wastes at most 1 - 1/1.25² = 36% of a bucket's scores, and a row of similar
# lengths (an RL step) is one or two calls.
BUCKET_RATIO = 1.25


def _buckets(ids: list[int], lengths: tuple[int, ...]) -> list[list[int]]:
    """Sequences ``ids`` (non-empty ones) longest first, grouped within ``BUCKET_RATIO``."""
    order = sorted((i for i in ids if lengths[i] > 0), key=lambda i: -lengths[i])
    buckets: list[list[int]] = []
    for i in order:
        if buckets and lengths[i] * BUCKET_RATIO >= lengths[buckets[-1][0]]:
            buckets[-1].append(i)
        else:
            buckets.append([i])
    return buckets


def _rows(first: Tensor, lens: Tensor, width: int) -> tuple[Tensor, Tensor]:
    """Gather index [n, width] of sequences starting at ``first`` (pads repeat the last token)
    and the flat index of its valid entries."""
    j = torch.arange(width)
    gather = first[:, None] + torch.minimum(j[None], lens[:, None] - 1)
    valid = (j[None] < lens[:, None]).flatten().nonzero().squeeze(1)
    return gather, valid


@lru_cache(maxsize=256)
def _plan(lengths: tuple[int, ...], device: str) -> tuple[list[tuple[Tensor, Tensor]], Tensor]:
    """Buckets of a row: per bucket (gather index [n, L], valid flat index), plus the inverse
    permutation that puts the buckets' valid outputs back in row order."""
    causal, shared, inverse = _prefix_plan(lengths, (-1,) * len(lengths), device)
    assert not shared
    return causal, inverse


@lru_cache(maxsize=256)
def _prefix_plan(
    lengths: tuple[int, ...], prefix_of: tuple[int, ...], device: str
) -> tuple[list[tuple[Tensor, Tensor]], list[tuple[Tensor, Tensor, Tensor, Tensor]], Tensor]:
    """:func:`_plan` of a row whose sequences may attend to a prefix segment (``prefix_of``).

    Returns the causal buckets (sequences without a prefix), the prefix buckets (per bucket:
    query gather [n, L], key/value gather [n, P + L] (the prefix, padded to the bucket's longest
    prefix P, then the sequence itself), the boolean mask [n, 1, L, P + L] of what each query
    sees, valid flat index) and the inverse permutation back to row order.
    """
    starts = [0]
    for s in lengths:
        starts.append(starts[-1] + s)
    n = len(lengths)
    rows, causal, shared = [], [], []
    for bucket in _buckets([i for i in range(n) if prefix_of[i] < 0], lengths):
        first = torch.tensor([starts[i] for i in bucket])
        gather, valid = _rows(first, torch.tensor([lengths[i] for i in bucket]), lengths[bucket[0]])
        causal.append((gather.to(device), valid.to(device)))
        rows.append(gather.flatten()[valid])
    for bucket in _buckets([i for i in range(n) if prefix_of[i] >= 0], lengths):
        width = lengths[bucket[0]]
        first = torch.tensor([starts[i] for i in bucket])
        gather, valid = _rows(first, torch.tensor([lengths[i] for i in bucket]), width)
        heads = [prefix_of[i] for i in bucket]
        plens = torch.tensor([lengths[h] for h in heads])
        pre, _ = _rows(torch.tensor([starts[h] for h in heads]), plens, int(plens.max()))
        seen = torch.arange(pre.shape[1])[None] < plens[:, None]  # [n, P]: real prefix keys
        causal_mask = torch.ones(width, width, dtype=torch.bool).tril()
        mask = torch.cat(
            [seen[:, None].expand(-1, width, -1), causal_mask[None].expand(len(bucket), -1, -1)],
            dim=2,
        )
        kv = torch.cat([pre, gather], dim=1)
        shared.append(
            (gather.to(device), kv.to(device), mask[:, None].to(device), valid.to(device))
        )
        rows.append(gather.flatten()[valid])
    inverse = torch.empty(starts[-1], dtype=torch.long)
    inverse[torch.cat(rows)] = torch.arange(starts[-1])
    return causal, shared, inverse.to(device)


def _heads(x: Tensor, index: Tensor, heads: int) -> Tensor:
    """Rows ``index`` [n, L] of x [T, heads, d] as [n, heads, L, d]."""
    n, width = index.shape
    return x.index_select(0, index.flatten()).view(n, width, heads, -1).transpose(1, 2)


def varlen_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens: Tensor,
    scale: float | None = None,
    prefix_of: tuple[int, ...] | None = None,
) -> Tensor:
    """Causal attention within each packed sequence, plus each one's prefix segment if any.

    q: [T, hq, d]; k, v: [T, hk, d] with hq a multiple of hk (grouped-query attention);
    cu_seqlens: [N + 1] cumulative sequence lengths (cu_seqlens[-1] == T); scale: softmax scale
    (default 1/sqrt(d)); prefix_of: per sequence the index of the sequence it also attends to in
    full (a shared prompt, ``megatron_rl.packing.batch.pack_groups``) or -1 (None: all -1). Returns
    [T, hq, d]: token t of sequence i attends to tokens cu_seqlens[i] .. t and, if
    prefix_of[i] = j >= 0, to every token of sequence j. Cost: sum over buckets of n * L * (P + L)
    instead of T².
    """
    total, hq, _ = q.shape
    if int(cu_seqlens[-1]) != total:
        raise ValueError(f"cu_seqlens[-1]={int(cu_seqlens[-1])} must equal the row length {total}")
    if hq != k.shape[1]:
        k = k.repeat_interleave(hq // k.shape[1], dim=1)
        v = v.repeat_interleave(hq // v.shape[1], dim=1)
    lengths = tuple((cu_seqlens[1:] - cu_seqlens[:-1]).tolist())
    prefix = tuple(prefix_of) if prefix_of else (-1,) * len(lengths)
    causal, shared, inverse = _prefix_plan(lengths, prefix, str(q.device))
    outs = []
    for gather, valid in causal:
        qb, kb, vb = (_heads(x, gather, hq) for x in (q, k, v))
        ob = F.scaled_dot_product_attention(qb, kb, vb, is_causal=True, scale=scale)
        outs.append(ob.transpose(1, 2).reshape(-1, hq, q.shape[2]).index_select(0, valid))
    for gather, kv, mask, valid in shared:
        qb, kb, vb = _heads(q, gather, hq), _heads(k, kv, hq), _heads(v, kv, hq)
        ob = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask, scale=scale)
        outs.append(ob.transpose(1, 2).reshape(-1, hq, q.shape[2]).index_select(0, valid))
    out = outs[0] if len(outs) == 1 else torch.cat(outs)
    return out.index_select(0, inverse)


@dataclass
class PrefixSeqParams(PackedSeqParams):
    """THD ``PackedSeqParams`` of a shared-prefix row: also each sequence's prefix segment
    (``prefix_of``, see :func:`varlen_attention`) and every token's RoPE position [T] (for a CP
    split: of the whole padded row), read by :class:`TokenRotaryEmbedding`."""

    prefix_of: tuple[int, ...] = ()
    rope_positions: Tensor | None = None


def row_params(batch: PackedBatch) -> PackedSeqParams:
    """THD params of one packed row: RoPE restarting per sequence (megatron-core's THD RoPE), or
    for a shared-prefix row (``batch.shared_prefix``) :class:`PrefixSeqParams`."""
    cu = batch.cu_seqlens.int()
    longest = int((cu[1:] - cu[:-1]).max())
    common = dict(
        qkv_format="thd",
        cu_seqlens_q=cu,
        cu_seqlens_kv=cu,
        max_seqlen_q=longest,
        max_seqlen_kv=longest,
    )
    if not batch.shared_prefix:
        return PackedSeqParams(**common)
    return PrefixSeqParams(
        **common, prefix_of=tuple(batch.prefix_of), rope_positions=batch.position_ids
    )


class _Positions:
    """Per-token RoPE positions, handed from ``get_rotary_seq_len`` to ``forward``."""

    def __init__(self, positions: Tensor) -> None:
        self.positions = positions


class TokenRotaryEmbedding(torch.nn.Module):
    """The model's ``RotaryEmbedding``, plus per-token positions for :class:`PrefixSeqParams`.

    megatron-core's ``GPTModel`` asks its rotary module for a length (``get_rotary_seq_len``,
    given the packed params) and then for the table of that many positions; its THD RoPE
    (``rope_utils._apply_rotary_pos_emb_thd``) uses a table with one row per token of the row
    (``freqs.size(0) == cu_seqlens[-1]``) as exact per-token frequencies. For a shared-prefix
    row this module returns that table, row t rotating by ``rope_positions[t]``; any other row
    goes to the wrapped module unchanged. It holds no parameters (the state dict is unchanged).
    """

    def __init__(self, inner: Any) -> None:
        super().__init__()
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        """Anything else (``inv_freq``, ``rotary_interleaved``...) is the wrapped module's."""
        try:
            return super().__getattr__(name)
        except AttributeError:
            inner = self.__dict__["_modules"].get("inner")
            if inner is None:
                raise
            return getattr(inner, name)

    def get_rotary_seq_len(self, *args: Any, **kwargs: Any) -> Any:
        packed = kwargs.get("packed_seq_params", args[4] if len(args) > 4 else None)
        positions = getattr(packed, "rope_positions", None)
        if positions is not None:
            return _Positions(positions)
        return self.inner.get_rotary_seq_len(*args, **kwargs)

    def forward(self, max_seq_len: Any, *args: Any, **kwargs: Any) -> Tensor:
        if isinstance(max_seq_len, _Positions):
            pos = max_seq_len.positions
            table: Tensor = self.inner(int(pos.max()) + 1, *args, **kwargs)
            return table.index_select(0, pos.to(table.device).long())
        out: Tensor = self.inner(max_seq_len, *args, **kwargs)
        return out


def install_token_rope(model: Any) -> None:
    """Wrap ``model.rotary_pos_emb`` (a megatron-core GPTModel's) in TokenRotaryEmbedding."""
    rope = getattr(model, "rotary_pos_emb", None)
    if rope is not None and not isinstance(rope, TokenRotaryEmbedding):
        model.rotary_pos_emb = TokenRotaryEmbedding(rope)


class VarlenDotProductAttention(DotProductAttention):
    """megatron-core's local core attention that also takes THD ``PackedSeqParams``."""

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        attention_mask: Tensor | None,
        attn_mask_type: Any = None,
        attention_bias: Tensor | None = None,
        packed_seq_params: Any = None,
    ) -> Tensor:
        """THD: query [T, np, hn], key/value [T, ng, hn] -> [T, np * hn]; else the dense path."""
        if packed_seq_params is None:
            return super().forward(
                query, key, value, attention_mask, attn_mask_type, attention_bias, None
            )
        if packed_seq_params.qkv_format != "thd" or attention_bias is not None:
            raise ValueError(
                "VarlenDotProductAttention takes packed_seq_params with qkv_format='thd' and no "
                f"attention_bias, got qkv_format={packed_seq_params.qkv_format!r}"
            )
        cu_q, cu_kv = packed_seq_params.cu_seqlens_q, packed_seq_params.cu_seqlens_kv
        if cu_kv is not None and cu_kv is not cu_q and not torch.equal(cu_q, cu_kv):
            raise ValueError("VarlenDotProductAttention needs cu_seqlens_q == cu_seqlens_kv")
        prefix_of = getattr(packed_seq_params, "prefix_of", None)
        out = varlen_attention(query, key, value, cu_q, self.softmax_scale, prefix_of)
        return out.reshape(out.shape[0], -1)
