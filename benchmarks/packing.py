"""Trained tokens/s on a long-tail length mix: packed (token budget) vs padded micro-batches.

One run, both arms on the same model and the same sequences, so the ratio is what matters:

- padded: micro-batches of ``--batch`` sequences in arrival order, each padded to its longest
  member ([B, S_max] with a causal mask), the usual unpacked layout;
- packed: the same sequences packed by ``plan_microbatches`` (token budget ``--budget``) into one
  row per micro-batch with a block-diagonal causal mask (the CPU form of THD packing).

Model: the megatron-core GPTModel of ``ModelConfig`` defaults (4 layers, hidden 256, the tiny
policy's shape), forward + backward of a token-mean loss with plain autograd (the optimizer step
is the same for both arms and is left out). "Trained tokens" are real tokens; padding is waste.

Wall time and process CPU time are both reported: on a shared, oversubscribed machine CPU time
(with ``--threads 1``) is the steadier measure of work done; wall time includes waiting.

On CPU attention is computed densely under the mask, so a packed row pays attention over its whole
budget (T^2) while real THD kernels (TE on GPU) pay only per sequence; the measured gain here is
therefore a lower bound of the GPU one.

    .venv/bin/python -m benchmarks.packing [--seqs 96] [--budget 2048] [--batch 8] [--max-len 2048]
        [--threads 2]
"""

from __future__ import annotations

import argparse
import os
import random
import time

import torch

from megatron_rl.model.config import ModelConfig, ParallelConfig
from megatron_rl.packing.balance import padding_fraction, plan_microbatches
from megatron_rl.packing.batch import PackedBatch, pack


def long_tail_lengths(n: int, seed: int, cap: int) -> list[int]:
    """Many short, few long: log-normal (median ~180 tokens), clipped to [16, cap]."""
    rng = random.Random(seed)
    return [max(16, min(cap, int(rng.lognormvariate(5.2, 0.9)))) for _ in range(n)]


def block_causal_mask(cu_seqlens: torch.Tensor) -> torch.Tensor:
    lens = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    seg = torch.repeat_interleave(torch.arange(len(lens)), lens)
    t = torch.arange(seg.numel())
    return (~((seg[:, None] == seg[None, :]) & (t[None, :] <= t[:, None])))[None, None]


def step_packed(model, batch: PackedBatch) -> None:
    logits = model(
        batch.tokens[None], batch.position_ids[None], block_causal_mask(batch.cu_seqlens)
    )
    lp = torch.log_softmax(logits[0, :-1].float(), -1).gather(1, batch.tokens[1:, None])[:, 0]
    (-(lp * batch.loss_mask[1:]).sum() / max(1.0, float(batch.loss_mask.sum()))).backward()


def step_padded(model, seqs: list[list[int]]) -> None:
    s_max, b = max(len(s) for s in seqs), len(seqs)
    tokens = torch.zeros(b, s_max, dtype=torch.long)
    mask = torch.zeros(b, s_max)
    for i, s in enumerate(seqs):
        tokens[i, : len(s)] = torch.tensor(s)
        mask[i, 1 : len(s)] = 1.0
    causal = torch.ones(s_max, s_max, dtype=torch.bool).triu(1)[None, None].expand(b, 1, -1, -1)
    logits = model(tokens, torch.arange(s_max)[None].expand(b, -1), causal)
    lp = torch.log_softmax(logits[:, :-1].float(), -1).gather(2, tokens[:, 1:, None])[..., 0]
    (-(lp * mask[:, 1:]).sum() / mask.sum()).backward()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seqs", type=int, default=96, help="sequences in the batch")
    ap.add_argument("--budget", type=int, default=2048, help="packed micro-batch budget, tokens")
    ap.add_argument("--batch", type=int, default=8, help="sequences per padded micro-batch")
    ap.add_argument("--max-len", type=int, default=2048, help="longest sequence, tokens")
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from megatron_rl.model.gpt import build_gpt_model
    from megatron_rl.model.parallel import destroy_distributed, init_distributed

    cfg = ModelConfig()
    init_distributed(ParallelConfig(), seed=args.seed)
    model = build_gpt_model(cfg, pre_process=True, post_process=True)
    lengths = long_tail_lengths(args.seqs, args.seed, cap=args.max_len)
    rng = random.Random(args.seed)
    seqs = [[rng.randrange(cfg.vocab_size) for _ in range(n)] for n in lengths]
    real = sum(lengths)

    rows = [list(range(i, min(i + args.batch, len(seqs)))) for i in range(0, len(seqs), args.batch)]
    bins = plan_microbatches(lengths, args.budget, dp_size=1)[0]
    packed = [pack([seqs[i] for i in b], [[1.0] * lengths[i] for i in b]) for b in bins]
    step_padded(model, [seqs[i] for i in rows[0]])  # warm-up (allocator, kernels)

    # Interleave the arms (padded step, packed step, ...) so load changes on a shared machine
    # hit both alike; each arm's time is the sum of its own steps.
    wall = {"padded": 0.0, "packed": 0.0}
    cpu = {"padded": 0.0, "packed": 0.0}
    for i in range(max(len(rows), len(packed))):
        if i < len(rows):
            w, c = time.perf_counter(), time.process_time()
            step_padded(model, [seqs[j] for j in rows[i]])
            wall["padded"] += time.perf_counter() - w
            cpu["padded"] += time.process_time() - c
        if i < len(packed):
            w, c = time.perf_counter(), time.process_time()
            step_packed(model, packed[i])
            wall["packed"] += time.perf_counter() - w
            cpu["packed"] += time.process_time() - c
        model.zero_grad(set_to_none=True)
    destroy_distributed()

    pad_padded = padding_fraction(lengths, rows)
    unfilled = 1.0 - real / (len(bins) * args.budget)  # budget slack (not computed, not padding)
    print(f"machine: {os.cpu_count()} cores, torch threads {args.threads}")
    print(f"model: megatron GPTModel {cfg.num_layers}x{cfg.hidden_size}, fwd+bwd, fp32")
    print(
        f"batch: {len(seqs)} seqs, {real} real tokens, lengths min {min(lengths)} "
        f"median {sorted(lengths)[len(lengths) // 2]} max {max(lengths)}"
    )
    arms = {
        "padded": (f"{len(rows)} micro-batches of {args.batch} seqs", f"{pad_padded:.3f}"),
        "packed": (
            f"{len(bins)} micro-batches <= {args.budget} tokens",
            f"0.000 (budget left unfilled {unfilled:.3f})",
        ),
    }
    for arm, (what, pad) in arms.items():
        print(
            f"{arm}: {what}, wall {wall[arm]:.2f} s ({real / wall[arm]:.0f} tok/s), "
            f"CPU {cpu[arm]:.2f} s ({real / cpu[arm]:.0f} tok/CPU-s), padding fraction {pad}"
        )
    print(
        f"ratio packed/padded tokens/s: wall {wall['padded'] / wall['packed']:.2f}x, "
        f"CPU time {cpu['padded'] / cpu['packed']:.2f}x"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
