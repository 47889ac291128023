"""Context-parallel core attention for CPU (and any device without Transformer Engine).

Plugs into megatron-core's local layer spec as the ``core_attention`` submodule of self-attention
when ``parallel.cp > 1`` (see ``megatron_rl/model/gpt.py``). It consumes exactly the batch layout
of Transformer Engine's THD context parallelism (``cp/te.py``), so the policy feeds
both paths the same inputs:

- every packed sequence is padded to a multiple of ``2 * cp`` and cut into ``2 * cp`` chunks;
  CP rank ``r`` holds chunks ``r`` and ``2cp - 1 - r`` of every sequence, sequence after sequence
  (TE's ``thd_get_partitioned_indices``; ``megatron_rl/model/cp/shard.py``);
- ``PackedSeqParams(qkv_format="thd")`` carries the *global* ``cu_seqlens_q_padded``, from which
  every rank derives where each rank's chunks sit. Megatron applies RoPE per sequence from the
  same boundaries (``rope_utils._apply_rotary_pos_emb_thd``), so the query and key rotations are
  those of the chunks' global positions.

Keys and values are all-gathered over the CP group and put back in global order; each local query
chunk then attends to the keys of its own sequence up to its own global position (causal mask
from global positions; padding sits at the end of each sequence, after every real query). The
all-gather's backward sums the gradient of the gathered K/V over the CP group and keeps this
rank's slice (a reduce-scatter; gloo has none, so all-reduce + slice), because every rank's
queries read every rank's keys.

The per-chunk attention is ``torch.nn.functional.scaled_dot_product_attention`` with a boolean
mask of the chunk's shape (``[c, (j + 1) c]`` for global chunk ``j``), so memory grows with the
chunk, not with the square of the row: that is what makes 8k-16k tokens fit on a CPU.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from megatron.core.transformer.module import MegatronModule
from torch import Tensor


class _GatherKV(torch.autograd.Function):
    """All-gather along dim 0 over ``group``; backward: sum the gradient over ranks, keep ours."""

    @staticmethod
    def forward(ctx: Any, local: Tensor, group: Any) -> Tensor:
        ctx.group = group
        ctx.rank = dist.get_rank(group)
        ctx.size = local.shape[0]
        parts = [torch.empty_like(local) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, local.contiguous(), group=group)
        return torch.cat(parts, 0)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)  # reduce-scatter = all-reduce + own slice (gloo)
        start = ctx.rank * ctx.size
        return grad[start : start + ctx.size], None


def gather_kv(local: Tensor, group: Any) -> Tensor:
    """[L, ...] on each CP rank -> [cp * L, ...] in rank order, autograd-correct."""
    out: Tensor = _GatherKV.apply(local, group)
    return out


def rank_order_index(cu_seqlens_padded: Tensor, cp: int) -> Tensor:
    """Global padded-row position of each entry of the rank-ordered gather ([T_pad] int64).

    Entry ``r * L + i`` of the gathered tensor is local token ``i`` of rank ``r``.
    """
    cu = cu_seqlens_padded.to("cpu", torch.int64).tolist()
    per_rank: list[list[Tensor]] = [[] for _ in range(cp)]
    for start, end in zip(cu[:-1], cu[1:], strict=True):
        c = (end - start) // (2 * cp)
        for r in range(cp):
            per_rank[r].append(torch.arange(start + r * c, start + (r + 1) * c))
            j = 2 * cp - 1 - r
            per_rank[r].append(torch.arange(start + j * c, start + (j + 1) * c))
    return torch.cat([torch.cat(p) for p in per_rank if p] or [torch.zeros(0, dtype=torch.int64)])


def to_global_order(gathered: Tensor, cu_seqlens_padded: Tensor, cp: int) -> Tensor:
    """Rank-ordered gather [T_pad, ...] -> the padded packed row in sequence order [T_pad, ...]."""
    index = rank_order_index(cu_seqlens_padded, cp).to(gathered.device)
    inverse = torch.empty_like(index)
    inverse[index] = torch.arange(index.numel(), device=index.device)
    return gathered.index_select(0, inverse)


def _chunk_attention(
    q: Tensor, k: Tensor, v: Tensor, offset: int, scale: float, prefix: int = 0
) -> Tensor:
    """q [c, H, D] at global positions offset..offset+c-1 of its sequence; k/v [prefix + offset +
    c, H, D]: ``prefix`` keys of a shared prefix segment (all visible), then the sequence's own.

    Returns [c, H, D]: causal attention of the chunk over its sequence's keys (and its prefix).
    """
    c, n_k = q.shape[0], k.shape[0] - prefix
    qpos = torch.arange(offset, offset + c, device=q.device)
    allowed = torch.arange(n_k, device=q.device)[None, :] <= qpos[:, None]
    if prefix:
        allowed = torch.cat([allowed.new_ones(c, prefix), allowed], dim=1)
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None],
        k.transpose(0, 1)[None],
        v.transpose(0, 1)[None],
        attn_mask=allowed,
        scale=scale,
    )
    return out[0].transpose(0, 1)


def cp_packed_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    cu_seqlens_padded: Tensor,
    group: Any,
    scale: float,
    prefix_of: tuple[int, ...] = (),
    cu_seqlens: Tensor | None = None,
) -> Tensor:
    """Causal attention of this rank's THD queries over the whole CP-split packed row.

    query [L, H, D], key/value [L, G, D] (G query groups, H % G == 0) in this rank's layout;
    ``cu_seqlens_padded`` [n + 1] the global padded boundaries. A shared-prefix row
    (``megatron_rl.packing.batch.pack_groups``) also gives ``prefix_of`` (per sequence, the
    sequence it attends to in full, or -1) and the real boundaries ``cu_seqlens``: since every
    rank gathers the whole row's keys, a prefix may lie on any rank. Returns [L, H, D].
    """
    cp = dist.get_world_size(group)
    rank = dist.get_rank(group)
    keys = to_global_order(gather_kv(key, group), cu_seqlens_padded, cp)
    values = to_global_order(gather_kv(value, group), cu_seqlens_padded, cp)
    groups = query.shape[1] // key.shape[1]
    if groups > 1:
        keys = keys.repeat_interleave(groups, dim=1)
        values = values.repeat_interleave(groups, dim=1)
    cu = cu_seqlens_padded.to("cpu", torch.int64).tolist()
    real = [] if cu_seqlens is None else cu_seqlens.to("cpu", torch.int64).tolist()
    outs, local = [], 0
    for s, (start, end) in enumerate(zip(cu[:-1], cu[1:], strict=True)):
        c = (end - start) // (2 * cp)
        head = prefix_of[s] if prefix_of else -1
        pk = pv = keys[:0]
        if head >= 0:  # the prefix's real tokens (its padding is left out)
            pk = keys[cu[head] : cu[head] + real[head + 1] - real[head]]
            pv = values[cu[head] : cu[head] + real[head + 1] - real[head]]
        for j in (rank, 2 * cp - 1 - rank):
            q = query[local : local + c]
            stop = start + (j + 1) * c
            k = torch.cat([pk, keys[start:stop]]) if head >= 0 else keys[start:stop]
            v = torch.cat([pv, values[start:stop]]) if head >= 0 else values[start:stop]
            outs.append(_chunk_attention(q, k, v, j * c, scale, pk.shape[0]))
            local += c
    return torch.cat(outs, 0) if outs else query.new_zeros(query.shape)


class CPDotProductAttention(MegatronModule):
    """megatron-core core attention (local spec) for CP > 1: :func:`cp_packed_attention`.

    Takes the constructor arguments megatron's ``Attention`` passes to any core attention and the
    THD forward of ``TEDotProductAttention``: query [L, H, D], key/value [L, G, D], with
    ``packed_seq_params.cu_seqlens_q_padded`` the global padded boundaries. Returns [L, H * D].
    """

    def __init__(
        self,
        config: Any,
        layer_number: int,
        attn_mask_type: Any,
        attention_type: str,
        attention_dropout: float | None = None,
        softmax_scale: float | None = None,
        cp_comm_type: str | None = None,
        pg_collection: Any = None,
    ) -> None:
        super().__init__(config=config)
        if config.apply_query_key_layer_scaling or config.softmax_type != "vanilla":
            raise ValueError(
                "CP attention on CPU supports plain softmax attention only "
                "(apply_query_key_layer_scaling=False, softmax_type='vanilla')"
            )
        head_dim = config.kv_channels or config.hidden_size // config.num_attention_heads
        self.softmax_scale = softmax_scale or head_dim**-0.5
        group = getattr(pg_collection, "cp", None) if pg_collection is not None else None
        if group is None:
            from megatron.core import parallel_state as mpu

            group = mpu.get_context_parallel_group()
        self.cp_group = group

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        attention_mask: Tensor | None,
        attn_mask_type: Any = None,
        attention_bias: Any = None,
        packed_seq_params: Any = None,
    ) -> Tensor:
        if packed_seq_params is None or packed_seq_params.qkv_format != "thd":
            raise ValueError(
                "context-parallel attention without Transformer Engine takes packed THD inputs "
                "(PackedSeqParams with cu_seqlens_q_padded), as Policy builds them"
            )
        cu = packed_seq_params.cu_seqlens_q_padded
        prefix_of = getattr(packed_seq_params, "prefix_of", ())
        if cu is None and dist.get_world_size(self.cp_group) == 1:
            # a row this rank runs alone (megatron_rl/model/cp/switch.py): the whole-row kernel
            return self._whole(query, key, value, packed_seq_params.cu_seqlens_q, prefix_of)
        if cu is None:
            cu = packed_seq_params.cu_seqlens_q
        out = cp_packed_attention(
            query,
            key,
            value,
            cu,
            group=self.cp_group,
            scale=self.softmax_scale,
            prefix_of=prefix_of,
            cu_seqlens=packed_seq_params.cu_seqlens_q,
        )
        return out.reshape(out.shape[0], -1)

    def _whole(
        self, query: Tensor, key: Tensor, value: Tensor, cu_seqlens: Tensor, prefix_of: Any
    ) -> Tensor:
        """Per-sequence causal attention of a row this rank runs alone ([L, H * D])."""
        from megatron_rl.model.attention import varlen_attention

        out = varlen_attention(query, key, value, cu_seqlens, self.softmax_scale, prefix_of or None)
        return out.reshape(out.shape[0], -1)
