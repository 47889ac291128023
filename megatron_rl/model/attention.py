"""Varlen core attention for packed rows without Transformer Engine (the CPU path).

A packed row holds several sequences back to back (``long_context.packing.PackedBatch``). On GPU,
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

from functools import lru_cache
from typing import Any

import torch
import torch.nn.functional as F
from megatron.core.transformer.dot_product_attention import DotProductAttention
from torch import Tensor

# Sequences whose length is within this factor of their bucket's longest share one padded SDPA
# call: padding wastes at most 1 - 1/1.25² = 36% of a bucket's scores, and a row of similar
# lengths (an RL step) is one or two calls.
BUCKET_RATIO = 1.25


@lru_cache(maxsize=256)
def _plan(lengths: tuple[int, ...], device: str) -> tuple[list[tuple[Tensor, Tensor]], Tensor]:
    """Buckets of a row: per bucket (gather index [n, L], valid flat index), plus the inverse
    permutation that puts the buckets' valid outputs back in row order."""
    starts = [0]
    for s in lengths:
        starts.append(starts[-1] + s)
    order = sorted((i for i, s in enumerate(lengths) if s > 0), key=lambda i: -lengths[i])
    buckets: list[list[int]] = []
    for i in order:
        if buckets and lengths[i] * BUCKET_RATIO >= lengths[buckets[-1][0]]:
            buckets[-1].append(i)
        else:
            buckets.append([i])
    plan, rows = [], []
    for bucket in buckets:
        width = lengths[bucket[0]]
        j = torch.arange(width)
        lens = torch.tensor([lengths[i] for i in bucket])
        first = torch.tensor([starts[i] for i in bucket])
        gather = first[:, None] + torch.minimum(j[None], lens[:, None] - 1)  # pads repeat last
        valid = (j[None] < lens[:, None]).flatten().nonzero().squeeze(1)
        plan.append((gather.to(device), valid.to(device)))
        rows.append(gather.flatten()[valid])
    inverse = torch.empty(starts[-1], dtype=torch.long)
    inverse[torch.cat(rows)] = torch.arange(starts[-1])
    return plan, inverse.to(device)


def varlen_attention(
    q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor, scale: float | None = None
) -> Tensor:
    """Causal attention within each packed sequence.

    q: [T, hq, d]; k, v: [T, hk, d] with hq a multiple of hk (grouped-query attention);
    cu_seqlens: [N + 1] cumulative sequence lengths (cu_seqlens[-1] == T); scale: softmax scale
    (default 1/sqrt(d)). Returns [T, hq, d]: token t of sequence i attends to tokens
    cu_seqlens[i] .. t. Cost: sum over buckets of n * L² instead of T².
    """
    total, hq, _ = q.shape
    if int(cu_seqlens[-1]) != total:
        raise ValueError(f"cu_seqlens[-1]={int(cu_seqlens[-1])} must equal the row length {total}")
    if hq != k.shape[1]:
        k = k.repeat_interleave(hq // k.shape[1], dim=1)
        v = v.repeat_interleave(hq // v.shape[1], dim=1)
    lengths = tuple((cu_seqlens[1:] - cu_seqlens[:-1]).tolist())
    plan, inverse = _plan(lengths, str(q.device))
    qkv = (q, k, v)
    outs = []
    for gather, valid in plan:
        n, width = gather.shape
        idx = gather.flatten()
        qb, kb, vb = (x.index_select(0, idx).view(n, width, hq, -1).transpose(1, 2) for x in qkv)
        ob = F.scaled_dot_product_attention(qb, kb, vb, is_causal=True, scale=scale)
        outs.append(ob.transpose(1, 2).reshape(n * width, hq, -1).index_select(0, valid))
    out = outs[0] if len(outs) == 1 else torch.cat(outs)
    return out.index_select(0, inverse)


class VarlenDotProductAttention(DotProductAttention):
    """megatron-core's local core attention that also takes THD ``PackedSeqParams``."""

    def forward(  # type: ignore[override]
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
        out = varlen_attention(query, key, value, cu_q, self.softmax_scale)
        return out.reshape(out.shape[0], -1)
