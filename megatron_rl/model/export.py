"""Stream the policy out in HF layout: gather over TP per PP stage, bucket by bucket, to rank 0.

Used by the weight sync and by the checkpoint's HF export. No collective spans the world:

1. only the ranks of data-parallel replica 0 (and context-parallel rank 0) take part; every other
   rank returns at once;
2. PP stages go one after the other. Inside stage ``s`` the TP ranks split their own shard into
   buckets of whole conversion units (the embedding, one transformer layer, the final norm, the
   output layer), at most ``bucket_bytes`` once gathered (a bigger unit is a bucket of its own),
   and all-gather one bucket at a time over the TP group (a tensor collective: NCCL on GPU);
3. TP rank 0 of the stage converts the gathered bucket to HF names and sends it to global rank 0
   over the CPU control group (gloo); global rank 0 yields it.

Peak extra memory on a rank is therefore one gathered bucket (plus its HF copy) beside the rank's
own shard; only global rank 0, the one process that writes or pushes, sees every bucket, and it
can write or push each one before the next arrives. ``benchmarks/export_memory.py`` measures it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from megatron_rl.model import convert
from megatron_rl.model.parallel import control_group

DEFAULT_BUCKET_BYTES = 512 * 2**20  # as rollout.sglang.bucket_mb's default


def _plan(shard: dict[str, Tensor], tp: int, bucket_bytes: int) -> list[list[str]]:
    """Buckets of whole units, at most ``bucket_bytes`` once gathered (a bigger unit alone).

    The same on every TP rank of a stage: the same names with the same shard shapes.
    """
    plan: list[list[str]] = [[]]
    size = 0
    for unit in convert.stage_units(list(shard)):
        nbytes = sum(shard[n].nbytes for n in unit) * tp
        if plan[-1] and size + nbytes > bucket_bytes:
            plan.append([])
            size = 0
        plan[-1].extend(unit)
        size += nbytes
    return [b for b in plan if b]


def _gather_bucket(shard: dict[str, Tensor], names: list[str], tp: int, group: Any) -> list[dict]:
    """Every TP rank's tensors of ``names`` (CPU), one all-gather per tensor."""
    parts: list[dict[str, Tensor]] = [{} for _ in range(tp)]
    for n in names:
        t = shard[n].detach().contiguous()
        if tp == 1:  # a copy: the caller may keep the bucket while the weights change
            parts[0][n] = t.to("cpu", copy=True)
            continue
        out = [torch.empty_like(t) for _ in range(tp)]
        dist.all_gather(out, t, group=group)
        for r in range(tp):
            parts[r][n] = out[r].cpu()
    return parts


def _stage_buckets(policy: Any, bucket_bytes: int) -> Iterator[dict[str, Tensor]]:
    """This stage's HF buckets, on its TP rank 0 (other TP ranks only take part in gathers)."""
    from megatron.core import parallel_state as mpu

    d = policy.dist
    shard = {k: v for k, v in policy.module.state_dict().items() if not k.endswith("_extra_state")}
    group = mpu.get_tensor_model_parallel_group()
    for names in _plan(shard, d.tp, bucket_bytes):
        parts = _gather_bucket(shard, names, d.tp, group)
        hf = (
            convert.stage_part_to_hf(parts, policy.cfg, d.tp, d.pp, d.pp_rank)
            if d.tp_rank == 0
            else {}
        )
        del parts  # the HF bucket holds what it needs: keep one copy, not two
        if hf:
            yield hf
        del hf


def hf_buckets(
    policy: Any, bucket_bytes: int = DEFAULT_BUCKET_BYTES
) -> Iterator[dict[str, Tensor]]:
    """The policy in HF layout, as a stream of buckets on global rank 0 (nothing elsewhere).

    Every rank must iterate it to the end (it is collective inside each stage's TP group and
    point-to-point from each stage's TP rank 0 to global rank 0).
    """
    from megatron.core import parallel_state as mpu

    d = policy.dist
    if d.dp_rank != 0 or d.cp_rank != 0:
        return
    leaders = dist.get_process_group_ranks(mpu.get_pipeline_model_parallel_group())
    ctrl = control_group()
    for stage in range(d.pp):
        if d.pp_rank == stage:
            for bucket in _stage_buckets(policy, bucket_bytes):
                if d.rank == 0:
                    yield bucket
                else:
                    dist.send_object_list([bucket], dst=0, group=ctrl)
                del bucket
            if d.tp_rank == 0 and d.rank != 0:
                dist.send_object_list([None], dst=0, group=ctrl)  # end of this stage
        elif d.rank == 0:
            while True:
                box: list[Any] = [None]
                dist.recv_object_list(box, src=leaders[stage], group=ctrl)
                if box[0] is None:
                    break
                yield box[0]


def gather_hf(policy: Any, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> dict[str, Tensor]:
    """The whole HF state dict on global rank 0 (``{}`` on every other rank)."""
    out: dict[str, Tensor] = {}
    for bucket in hf_buckets(policy, bucket_bytes):
        out.update(bucket)
    return out
