"""The GPU context-parallel path: a packed batch -> this rank's THD inputs for Transformer Engine.

``cp/shard.py`` decides which tokens a CP rank holds (pure, CPU-tested). This module turns
that into what a megatron-core ``GPTModel`` with the TE layer spec consumes under CP:

- ``tokens`` / ``position_ids`` ``[1, L]`` (this rank's share, ``L = T_pad / cp``);
- ``PackedSeqParams(qkv_format="thd")`` carrying the *global* boundaries: ``cu_seqlens_q/kv`` are
  the real sequence ends and ``cu_seqlens_q/kv_padded`` the ends after padding every sequence to a
  multiple of ``2 * cp``; TE's CP attention and Megatron's THD RoPE derive each rank's chunks from
  them (the same convention as megatron-core's ``get_thd_batch_on_this_cp_rank``).

Then :func:`cp_token_logprobs` computes the log-probs of this rank's labels from its logits (vocab
not split: TP = 1 here; with TP the caller uses its vocab-parallel log-softmax), and
:func:`gather_token_logprobs` all-gathers them over the CP group into the project's alignment
(``logprobs[t]`` scores ``tokens[t]``; 0 at sequence starts).

Only runs with CUDA + TE; ``tests/integration/test_cp_gpu.py`` checks it against CP = 1 on two GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from megatron_rl.model.cp.shard import CPShard, all_gather_merge, shard, to_padded, to_token_aligned
from megatron_rl.packing.batch import PackedBatch


@dataclass
class TEInputs:
    """One CP rank's model inputs; ``shard`` keeps labels, masks and the layout."""

    tokens: torch.Tensor  # [1, L] int64
    position_ids: torch.Tensor  # [1, L] int64, position inside each sequence
    packed_seq_params: Any  # megatron.core.packed_seq_params.PackedSeqParams (thd)
    shard: CPShard


def te_cp_inputs(
    batch: PackedBatch, cp: int, cp_rank: int, device: torch.device | str, pad_id: int = 0
) -> TEInputs:
    """Split ``batch`` for CP rank ``cp_rank`` and build TE's THD parameters on ``device``."""
    from megatron.core.packed_seq_params import PackedSeqParams

    part = shard(batch, cp, cp_rank, pad_id=pad_id)
    layout = part.layout
    cu = layout.cu_seqlens.to(device=device, dtype=torch.int32)
    cu_pad = layout.cu_seqlens_padded.to(device=device, dtype=torch.int32)
    longest = int((layout.cu_seqlens_padded[1:] - layout.cu_seqlens_padded[:-1]).max())
    common: dict[str, Any] = dict(
        qkv_format="thd",
        cu_seqlens_q=cu,
        cu_seqlens_kv=cu,
        cu_seqlens_q_padded=cu_pad,
        cu_seqlens_kv_padded=cu_pad,
        max_seqlen_q=longest,
        max_seqlen_kv=longest,
    )
    positions = part.position_ids
    if batch.shared_prefix:  # CPU CP attention only (the TE path packs without shared prefixes)
        from megatron_rl.model.attention import PrefixSeqParams

        rope = to_padded(batch.position_ids.cpu(), layout)  # the whole padded row, global order
        positions = rope[layout.rank_index[cp_rank]]
        params: Any = PrefixSeqParams(
            **common, prefix_of=tuple(batch.prefix_of), rope_positions=rope.to(device)
        )
    else:
        params = PackedSeqParams(**common)
    return TEInputs(
        tokens=part.tokens[None].to(device),
        position_ids=positions[None].to(device),
        packed_seq_params=params,
        shard=part,
    )


def te_partition_index(inputs: TEInputs, cp: int, cp_rank: int) -> torch.Tensor:
    """TE's own ``thd_get_partitioned_indices`` for the padded row (to cross-check :mod:`cp`)."""
    import transformer_engine_torch as tex

    cu_pad = inputs.packed_seq_params.cu_seqlens_q_padded
    total = int(cu_pad[-1])
    return tex.thd_get_partitioned_indices(cu_pad, total, cp, cp_rank)


def cp_token_logprobs(logits: torch.Tensor, part: CPShard) -> torch.Tensor:
    """log p(labels) on this rank: logits [L, V] (or [1, L, V]) -> [L] float32.

    Entries at padding and at each sequence's last token are meaningless; the loss multiplies by
    ``part.label_mask`` and :func:`gather_token_logprobs` drops them.
    """
    logits = logits.reshape(-1, logits.shape[-1]).float()
    labels = part.labels.to(logits.device)
    return torch.log_softmax(logits, -1).gather(1, labels[:, None])[:, 0]


def gather_token_logprobs(local: torch.Tensor, part: CPShard, group: Any = None) -> torch.Tensor:
    """All-gather local next-token log-probs over the CP group -> [T] in token alignment."""
    merged = all_gather_merge(local, part.layout, group=group)
    return to_token_aligned(merged, part.layout.cu_seqlens.to(merged.device))
