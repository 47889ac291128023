"""Throughput of the Policy on this machine vs. plain autograd on the same megatron GPTModel.

    .venv/bin/python tests/integration/dist/bench_policy.py [--threads 2] [--tokens 1024] [--iters 5]

Model: the default ``ModelConfig`` (4 layers, hidden 256, 4 heads of 64, 2 KV groups, vocab 384,
~3.3M parameters), fp32. Data: packed rows of ``--tokens`` tokens (sequences of 128). Baseline,
run beside it in the same process: the bare GPTModel called with the same block-diagonal mask,
log-softmax + gather, ``.backward()`` (no Megatron schedule, no DDP buffers, no optimizer). Prints
tokens/s (wall and per CPU-second, medians of alternating runs) of each and the ratio
policy/baseline, with the core count and load average (the CPU-second figure is the one that
survives a shared machine). Not a pytest test; also runs
under ``torchrun --nproc_per_node 2 ... --tp 2`` (rank 0 prints).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from megatron_rl.packing.batch import PackedBatch, pack
from megatron_rl.model.config import ModelConfig, ParallelConfig
from megatron_rl.model.gpt import block_causal_mask
from megatron_rl.model.parallel import destroy_distributed, init_distributed
from megatron_rl.model.policy import Policy
from megatron_rl.config.train import TrainConfig


def timed_pair(a: Callable[[], object], b: Callable[[], object], iters: int) -> list[float]:
    """Median wall and CPU seconds of ``a`` and ``b``, run alternately (fair under shared load)."""
    a(), b()  # warm-up
    samples: list[list[float]] = [[], [], [], []]
    for _ in range(iters):
        for k, fn in enumerate((a, b)):
            wall, cpu = time.perf_counter(), time.process_time()
            fn()
            samples[2 * k].append(time.perf_counter() - wall)
            samples[2 * k + 1].append(time.process_time() - cpu)
    return [statistics.median(s) for s in samples]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--tp", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cfg = ModelConfig()
    info = init_distributed(ParallelConfig(tp=args.tp), seed=0)
    policy = Policy(cfg, info, TrainConfig(lr=1e-4))
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(0, cfg.vocab_size, (128,), generator=g).tolist()] * (args.tokens // 128)
    batch = pack(seqs, [[1.0] * 128] * len(seqs))
    n = float(batch.loss_mask.sum())

    def loss_fn(b: PackedBatch, lp: torch.Tensor, ent: torch.Tensor):
        return -(lp * b.loss_mask).sum() / n, {}

    def train() -> None:
        policy.forward_backward([batch], loss_fn)
        policy.optimizer_step(lr=1e-4)

    model = policy.module
    mask = block_causal_mask(batch.cu_seqlens, batch.num_tokens)
    pos = torch.arange(batch.num_tokens)[None]

    def bare_loss() -> torch.Tensor:
        logits = model(batch.tokens[None], pos, mask)[0]
        lp = torch.log_softmax(logits.float(), -1)[:-1].gather(1, batch.tokens[1:, None])
        return -lp.sum() / n

    def baseline_train() -> None:
        bare_loss().backward()
        model.zero_grad(set_to_none=True)

    def baseline_score() -> None:
        with torch.no_grad():
            bare_loss()

    params = sum(p.numel() for p in model.parameters())
    results = {
        "train (fwd+bwd+step)": timed_pair(baseline_train, train, args.iters),
        "score (fwd)": timed_pair(
            baseline_score, lambda: policy.token_logprobs([batch]), args.iters
        ),
    }
    if dist.get_rank() == 0:
        t = batch.num_tokens
        print(f"cores={os.cpu_count()} threads={args.threads} tp={args.tp} params/rank={params} "
              f"tokens/row={t} load1={os.getloadavg()[0]:.1f}")  # fmt: skip
        for name, (bw, bc, pw, pc) in results.items():
            print(f"{name}: baseline {t / bw:.0f} tok/s ({t / bc:.0f} per CPU-s), policy "
                  f"{t / pw:.0f} tok/s ({t / pc:.0f} per CPU-s), policy/baseline wall "
                  f"{bw / pw:.2f}, CPU {bc / pc:.2f}")  # fmt: skip
    destroy_distributed()


if __name__ == "__main__":
    main()
