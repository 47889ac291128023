"""Peak extra memory per rank of the HF weight export: streamed per PP stage vs a world gather.

    torchrun --nproc_per_node 2 -m benchmarks.studies.export_memory --method stream [--tp 2] \
        [--bucket-mb 64] [--json OUT]
    torchrun --nproc_per_node 2 -m benchmarks.studies.export_memory --method world ...

Each rank builds the policy (``tiny_model.SIZES['100m']`` shape by default: ~92M parameters,
fp32, no optimizer) under TP=``--tp``, then exports it once:

- ``stream``: ``megatron_rl.model.export.hf_buckets`` (what weight sync and checkpoints use):
  gathers over TP inside each PP stage, one bucket at a time, to global rank 0, which consumes
  each bucket as a push would and drops it;
- ``world``: the previous ``Policy.hf_state_dict`` (``all_gather_object`` of every rank's shard
  over the whole world, then the full conversion on every rank), kept here for comparison.

A thread samples the resident set size (``/proc/self/statm``) every millisecond; the number is
``peak RSS during the export - RSS before it`` per rank. Run each method in its own launch (freed
memory stays in the allocator, so a second export in the same process would read low). On one
CPU machine this is the host-memory analogue of the GPU staging the issue is about.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import threading
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * PAGE


class PeakRSS:
    """Highest RSS seen between ``start`` and ``stop`` (1 ms sampling)."""

    def __init__(self) -> None:
        self.peak, self._on = 0, False

    def _run(self) -> None:
        while self._on:
            self.peak = max(self.peak, rss())
            time.sleep(0.001)

    def __enter__(self) -> PeakRSS:
        self.base = rss()
        self.peak, self._on = self.base, True
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._on = False
        self._t.join()
        self.peak = max(self.peak, rss())


def world_gather(policy: Any) -> dict[str, torch.Tensor]:
    """The replaced export: every rank gathers every shard and converts the whole model."""
    from megatron_rl.model import convert

    d = policy.dist
    mine = {k: v.cpu() for k, v in policy.model_state_shard().items()}
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (d.dp_rank, d.cp_rank, d.tp_rank, d.pp_rank, mine))
    shards = {(t, p): sd for dp, cp, t, p, sd in gathered if dp == 0 and cp == 0}
    return convert.megatron_to_hf(shards, policy.cfg, d.tp, d.pp)


def main() -> None:
    from benchmarks.tiny_model import SIZES
    from megatron_rl.model.config import ModelConfig, ParallelConfig
    from megatron_rl.model.convert import hf_param_shapes
    from megatron_rl.model.export import hf_buckets
    from megatron_rl.model.parallel import destroy_distributed, init_distributed
    from megatron_rl.model.policy import Policy

    p = argparse.ArgumentParser()
    p.add_argument("--method", choices=["stream", "world"], required=True)
    p.add_argument("--size", default="100m")
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--pp", type=int, default=1)
    p.add_argument("--bucket-mb", type=int, default=64)
    p.add_argument("--json")
    args = p.parse_args()
    torch.set_num_threads(1)
    dims = SIZES[args.size]
    cfg = ModelConfig(num_layers=dims["num_hidden_layers"], hidden_size=dims["hidden_size"],
                      ffn_hidden_size=3 * dims["hidden_size"],
                      num_attention_heads=dims["num_attention_heads"],
                      num_query_groups=dims["num_attention_heads"],
                      vocab_size=dims["vocab_size"], max_position_embeddings=1024)  # fmt: skip
    info = init_distributed(ParallelConfig(tp=args.tp, pp=args.pp), seed=0)
    policy = Policy(cfg, info, None)
    shard = sum(
        t.nbytes for t in policy.module.state_dict().values() if isinstance(t, torch.Tensor)
    )
    dist.barrier()
    t0 = time.time()
    received = 0
    with PeakRSS() as mem:
        if args.method == "stream":
            for bucket in hf_buckets(policy, args.bucket_mb * 2**20):
                received += sum(t.nbytes for t in bucket.values())
                del bucket  # pushed, then dropped
        else:
            received = sum(t.nbytes for t in world_gather(policy).values())
    dt = time.time() - t0
    row = {"rank": info.rank, "method": args.method, "tp": args.tp, "pp": args.pp,
           "params": sum(math.prod(s) for s in hf_param_shapes(cfg).values()),
           "bucket_mb": args.bucket_mb, "own_shard_mb": shard / 2**20,
           "peak_extra_mb": (mem.peak - mem.base) / 2**20, "received_mb": received / 2**20,
           "seconds": dt}  # fmt: skip
    rows: list[Any] = [None] * info.world_size
    dist.all_gather_object(rows, row)
    if info.rank == 0:
        for r in rows:
            print(json.dumps({k: round(v, 1) if isinstance(v, float) else v for k, v in r.items()}))
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=2))
    destroy_distributed()


if __name__ == "__main__":
    main()
