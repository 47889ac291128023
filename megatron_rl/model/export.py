"""Stream the policy out in HF layout: gather over TP per PP stage, bucket by bucket, to rank 0.

Used by the weight sync and by the checkpoint's HF export. No collective spans the world:

1. only the ranks of data-parallel replica 0 (and context-parallel rank 0) take part, and, for
   a mixture-of-experts model, the ranks of expert replica 0 (which hold the other EP ranks'
   experts); every other rank returns at once;
2. PP stages go one after the other. Inside stage ``s`` the ranks split their own shard into
   buckets of whole conversion units (the embedding, one transformer layer, the final norm, the
   output layer), at most ``bucket_bytes`` once gathered (a bigger unit is a bucket of its own),
   and all-gather one bucket at a time: dense tensors over the TP group, routed experts over the
   EP x expert-TP group (tensor collectives: NCCL on GPU);
3. TP rank 0 of replica 0 (the stage's leader) converts the gathered bucket to HF names and sends
   it to global rank 0 over the CPU control group (gloo); global rank 0 yields it.

Peak extra memory on a rank is therefore one gathered bucket (plus its HF copy) beside the rank's
own shard; only global rank 0, the one process that writes or pushes, sees every bucket, and it
can write or push each one before the next arrives. ``benchmarks/studies/export_memory.py``
measures it.
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


def is_expert(name: str) -> bool:
    """A routed expert's tensor (split over EP x expert-TP, not over TP like the rest)."""
    return ".mlp.experts." in name


def _plan(shard: dict[str, Tensor], tp: int, ep_tp: int, bucket_bytes: int) -> list[list[str]]:
    """Buckets of whole units, at most ``bucket_bytes`` once gathered (a bigger unit alone).

    The same on every rank of a stage that takes part: the same names with the same shapes.
    """
    plan: list[list[str]] = [[]]
    size = 0
    for unit in convert.stage_units(list(shard)):
        nbytes = sum(shard[n].nbytes * (ep_tp if is_expert(n) else tp) for n in unit)
        if plan[-1] and size + nbytes > bucket_bytes:
            plan.append([])
            size = 0
        plan[-1].extend(unit)
        size += nbytes
    return [b for b in plan if b]


def _gather(t: Tensor, size: int, group: Any) -> list[Tensor]:
    """``t`` from every member of ``group`` (CPU copies, group-rank order)."""
    t = t.detach().contiguous()
    if size == 1:  # a copy: the caller may keep the bucket while the weights change
        return [t.to("cpu", copy=True)]
    out = [torch.empty_like(t) for _ in range(size)]
    dist.all_gather(out, t, group=group)
    return [o.cpu() for o in out]


class _Groups:
    """Who gathers what in one stage: dense tensors over TP among data-parallel replica 0,
    expert tensors over EP x expert-TP among expert replica 0; ``coords[i]`` is the
    ``(etp_rank, ep_rank)`` of member i of the expert group."""

    def __init__(self, policy: Any) -> None:
        from megatron.core import parallel_state as mpu

        d = policy.dist
        self.tp, self.ep, self.etp = d.tp, d.ep, d.etp
        self.dense = d.dp_rank == 0 and d.cp_rank == 0
        self.experts = policy.cfg.is_moe and d.edp_rank == 0 and d.cp_rank == 0
        self.leader = self.dense and d.tp_rank == 0  # converts and sends this stage's buckets
        self.tp_group = mpu.get_tensor_model_parallel_group()
        self.coords: list[tuple[int, int]] = [(0, 0)]
        self.ep_group: Any = None
        if self.experts and d.ep * d.etp > 1:
            self.ep_group = mpu.get_expert_tensor_and_model_parallel_group()
            mine = torch.tensor([d.tp_rank if d.etp > 1 else 0, d.ep_rank], device=d.device)
            coords = _gather(mine, d.ep * d.etp, self.ep_group)
            self.coords = [(int(c[0]), int(c[1])) for c in coords]

    def bucket(self, shard: dict[str, Tensor], names: list[str]) -> dict[tuple[int, int], dict]:
        """``parts[(tp_rank, ep_rank)]``: every rank's tensors of ``names`` (see ``_Shards``)."""
        parts: dict[tuple[int, int], dict[str, Tensor]] = {
            (t, e): {} for t in range(self.tp) for e in range(self.ep)
        }
        for n in names:
            if is_expert(n):
                if self.experts:
                    tensors = _gather(shard[n], len(self.coords), self.ep_group)
                    for key, t in zip(self.coords, tensors, strict=True):
                        parts[key][n] = t
            elif self.dense:
                for r, t in enumerate(_gather(shard[n], self.tp, self.tp_group)):
                    parts[(r, 0)][n] = t
        return parts


def _stage_buckets(policy: Any, bucket_bytes: int) -> Iterator[dict[str, Tensor]]:
    """This stage's HF buckets, on its leader (the other ranks only take part in gathers)."""
    d = policy.dist
    shard = {k: v for k, v in policy.module.state_dict().items() if not k.endswith("_extra_state")}
    groups = _Groups(policy)
    for names in _plan(shard, d.tp, d.ep * d.etp, bucket_bytes):
        parts = groups.bucket(shard, names)
        grid = (d.tp, d.pp, d.ep, d.etp)
        hf = convert.stage_part_to_hf(parts, policy.cfg, grid, d.pp_rank) if groups.leader else {}
        del parts  # the HF bucket holds what it needs: keep one copy, not two
        if hf:
            yield hf
        del hf


def hf_buckets(
    policy: Any, bucket_bytes: int = DEFAULT_BUCKET_BYTES
) -> Iterator[dict[str, Tensor]]:
    """The policy in HF layout, as a stream of buckets on global rank 0 (nothing elsewhere).

    Every rank must iterate it to the end (it is collective inside each stage's TP and expert
    groups and point-to-point from each stage's leader to global rank 0).
    """
    from megatron.core import parallel_state as mpu

    d = policy.dist
    dense = d.dp_rank == 0 and d.cp_rank == 0
    experts = policy.cfg.is_moe and d.edp_rank == 0 and d.cp_rank == 0
    if not (dense or experts):
        return
    leaders = dist.get_process_group_ranks(mpu.get_pipeline_model_parallel_group())
    ctrl = control_group()
    leader = dense and d.tp_rank == 0
    for stage in range(d.pp):
        if d.pp_rank == stage:
            for bucket in _stage_buckets(policy, bucket_bytes):
                if d.rank == 0:
                    yield bucket
                else:
                    dist.send_object_list([bucket], dst=0, group=ctrl)
                del bucket
            if leader and d.rank != 0:
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
