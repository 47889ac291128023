"""Training step: trained tokens/s and model FLOPs utilisation (MFU) of the Megatron policy.

Runs the real training path (``Policy.forward_backward`` on packed batches + ``optimizer_step``)
on RL-shaped data (sequences of ``--seq-len`` tokens, packed into ``--micro-batch-tokens``
micro-batches) for two random models: ``tiny`` (the ``ModelConfig`` defaults, the demo policy's
shape) and ``100m`` (12 layers, hidden 768, ffn 3072: ~113M parameters).

Model FLOPs per step (the PaLM convention, no credit for recomputation or for causal masking):
``6 * N * tokens + 12 * layers * hidden * sum(seq_len^2)``, where ``N`` counts every weight
matrix a token goes through (the output layer included, the input embedding lookup excluded).

Peak FLOP/s, the denominator: **measured**, the best of several large fp32 matmuls
(``--peak-n`` square) with the same thread count, on this machine in this run. That is what a
dense kernel actually reaches here, so MFU reads as "share of the achievable matmul rate". The
theoretical AVX2 figure (2 FMA units x 8 fp32 lanes x 2 FLOP per cycle per core x cores x the
clock in /proc/cpuinfo) is printed beside it when the clock is readable, with MFU against it.

    .venv/bin/python -m benchmarks.train_step [--sizes tiny,100m] [--steps 3] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

SIZES: dict[str, dict[str, Any]] = {
    "tiny": {},  # ModelConfig defaults: 4 x 256, ffn 768, vocab 384
    "100m": dict(
        num_layers=12,
        hidden_size=768,
        ffn_hidden_size=3072,
        num_attention_heads=12,
        num_query_groups=12,
        vocab_size=384,
    ),
}


def measured_peak_flops(n: int, reps: int = 5) -> float:
    """Best FLOP/s of an ``n x n`` fp32 matmul (2 n^3 FLOP) over ``reps`` runs."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)  # warm-up
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best


def theoretical_peak_flops(cores: int) -> float | None:
    """AVX2 + FMA fp32 peak: 32 FLOP/cycle/core x cores x clock (None if unreadable)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    mhz = [float(m) for m in re.findall(r"cpu MHz\s*:\s*([\d.]+)", text)]
    if not mhz or "fma" not in text or "avx2" not in text:
        return None
    return 32.0 * cores * max(mhz) * 1e6


def matmul_params(cfg: Any) -> int:
    """Weights a token multiplies through: attention, MLP and output layer (not the lookup)."""
    h, f, hd = cfg.hidden_size, cfg.ffn_hidden_size, cfg.head_dim
    attn = h * hd * (cfg.num_attention_heads * 2 + cfg.num_query_groups * 2)  # q, o, k, v
    mlp = 3 * h * f  # gate, up, down (SwiGLU)
    return cfg.num_layers * (attn + mlp) + h * cfg.vocab_size


def step_flops(cfg: Any, seq_lens: list[int]) -> float:
    """Model FLOPs of one training step (forward + backward) over sequences ``seq_lens``."""
    tokens = sum(seq_lens)
    attn = 12 * cfg.num_layers * cfg.hidden_size * sum(s * s for s in seq_lens)
    return 6.0 * matmul_params(cfg) * tokens + attn


def make_batches(cfg: Any, n_seqs: int, seq_len: int, budget: int) -> list[Any]:
    """Random token sequences with a response loss mask, packed into ``budget``-token rows."""
    from megatron_rl.packing.batch import pack

    g = torch.Generator().manual_seed(0)
    per_row = max(1, budget // seq_len)
    batches = []
    for start in range(0, n_seqs, per_row):
        k = min(per_row, n_seqs - start)
        seqs = torch.randint(0, cfg.vocab_size, (k, seq_len), generator=g).tolist()
        masks = [[0.0] * (seq_len // 2) + [1.0] * (seq_len - seq_len // 2)] * k
        batches.append(pack(seqs, masks))
    return batches


def time_training(
    cfg: Any, args: argparse.Namespace, lr: float, sync: Callable[[], None] | None = None
) -> dict[str, Any]:
    """Time ``args.steps`` Policy training steps (after one warm-up) of model ``cfg``.

    ``sync`` (e.g. ``torch.cuda.synchronize``) is called around each step on an accelerator.
    """
    from megatron_rl.config.train import TrainConfig
    from megatron_rl.model.config import ParallelConfig
    from megatron_rl.model.parallel import destroy_distributed, init_distributed
    from megatron_rl.model.policy import Policy

    info = init_distributed(ParallelConfig(), seed=0)
    policy = Policy(cfg, info, TrainConfig(lr=lr))
    batches = make_batches(cfg, args.seqs, args.seq_len, args.micro_batch_tokens)
    total_tokens = sum(b.num_tokens for b in batches)

    def loss_fn(batch: Any, logprobs: torch.Tensor, entropy: torch.Tensor) -> Any:
        return -(logprobs * batch.loss_mask.to(logprobs.device)).sum() / total_tokens, {}

    times = []
    for _ in range(args.steps + 1):  # first step is warm-up
        if sync is not None:
            sync()
        t0 = time.perf_counter()
        policy.forward_backward(batches, loss_fn)
        policy.optimizer_step(lr)
        if sync is not None:
            sync()
        times.append(time.perf_counter() - t0)
    destroy_distributed()
    step_s = sum(times[1:]) / args.steps
    flops = step_flops(cfg, [args.seq_len] * args.seqs)
    return {
        "params": matmul_params(cfg) + cfg.hidden_size * cfg.vocab_size,
        "tokens_per_step": total_tokens,
        "step_s": step_s,
        "tokens_per_s": total_tokens / step_s,
        "achieved_flops": flops / step_s,
    }


def bench_size(name: str, args: argparse.Namespace) -> dict[str, Any]:
    from megatron_rl.model.config import ModelConfig

    return time_training(ModelConfig(**SIZES[name]), args, lr=1e-4)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="tiny,100m", help=f"comma list of {sorted(SIZES)}")
    p.add_argument("--steps", type=int, default=3, help="timed steps after one warm-up")
    p.add_argument("--seqs", type=int, default=64, help="sequences per step")
    p.add_argument("--seq-len", type=int, default=64, help="tokens per sequence")
    p.add_argument("--micro-batch-tokens", type=int, default=2048, help="packed row budget")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    p.add_argument("--peak-n", type=int, default=2048, help="matmul size for the measured peak")
    p.add_argument("--json", default=None, help="write the numbers here")
    args = p.parse_args()
    for s in args.sizes.split(","):
        if s not in SIZES:
            raise SystemExit(f"unknown size {s!r}; choose from {sorted(SIZES)}")
    torch.set_num_threads(args.threads)
    cores = os.cpu_count() or 1
    peak = measured_peak_flops(args.peak_n)
    theo = theoretical_peak_flops(args.threads)
    out: dict[str, Any] = {
        "cores": cores,
        "threads": args.threads,
        "load_avg_1m": os.getloadavg()[0],
        "peak_flops_measured": peak,
        "peak_flops_theoretical": theo,
        "peak_source": f"measured best {args.peak_n}^2 fp32 matmul, {args.threads} threads",
        "sizes": {},
    }
    for name in args.sizes.split(","):
        r = bench_size(name, args)
        r["mfu"] = r["achieved_flops"] / peak
        r["mfu_vs_theoretical"] = r["achieved_flops"] / theo if theo else None
        out["sizes"][name] = r
    out["mfu"] = {k: v["mfu"] for k, v in out["sizes"].items()}
    out["tokens_per_s"] = {k: v["tokens_per_s"] for k, v in out["sizes"].items()}
    print_table(out)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


def print_table(out: dict[str, Any]) -> None:
    theo = out["peak_flops_theoretical"]
    print(
        f"cores={out['cores']} threads={out['threads']} load_avg_1m={out['load_avg_1m']:.1f}; "
        f"peak (measured matmul) {out['peak_flops_measured'] / 1e9:.1f} GFLOP/s; "
        f"theoretical AVX2 {'n/a' if theo is None else f'{theo / 1e9:.1f} GFLOP/s'}"
    )
    print(f"{'model':<8}{'params':>10}{'tok/step':>10}{'step s':>9}{'tok/s':>10}{'GFLOP/s':>10}")
    for name, r in out["sizes"].items():
        print(
            f"{name:<8}{r['params'] / 1e6:>9.1f}M{r['tokens_per_step']:>10}{r['step_s']:>9.3f}"
            f"{r['tokens_per_s']:>10.0f}{r['achieved_flops'] / 1e9:>10.2f}  MFU {r['mfu']:.3f}"
            + (f" (vs theoretical {r['mfu_vs_theoretical']:.3f})" if theo else "")
        )


if __name__ == "__main__":
    main()
