"""Training-step MFU on one GPU (written for an H200) for a model of a few hundred M parameters.

Same measurement as ``train_step.py`` (the real ``Policy.forward_backward`` + ``optimizer_step``
on packed RL-shaped batches, PaLM-convention model FLOPs), on CUDA in bf16, for a ~350M model
(24 layers, hidden 1024, ffn 4096, 16 heads, vocab 32768). Two denominators, both printed:

- measured: the best bf16 ``--peak-n`` square matmul on this GPU in this run;
- datasheet: ``--datasheet-tflops`` (989 for an H100/H200 SXM dense bf16; pass another value for
  another GPU). MFU is quoted against the datasheet figure, as is usual for GPUs.

Not run in the session that wrote it (no GPU was lent): see ``gpu_mfu.sh`` and the README.

    python -m benchmarks.gpu_mfu [--steps 5] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.train_step import time_training

MODEL = dict(
    num_layers=24,
    hidden_size=1024,
    ffn_hidden_size=4096,
    num_attention_heads=16,
    num_query_groups=16,
    vocab_size=32768,
    dtype="bfloat16",
)


def measured_peak(n: int, reps: int = 10) -> float:
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        a @ b
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best


def train_mfu(args: argparse.Namespace) -> dict[str, Any]:
    from megatron_rl.model.config import ModelConfig

    cfg = ModelConfig(**MODEL)  # type: ignore[arg-type]
    return time_training(cfg, args, lr=1e-5, sync=torch.cuda.synchronize)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=5, help="timed steps after one warm-up")
    p.add_argument("--seqs", type=int, default=64, help="sequences per step")
    p.add_argument("--seq-len", type=int, default=1024, help="tokens per sequence")
    p.add_argument("--micro-batch-tokens", type=int, default=8192, help="packed row budget")
    p.add_argument("--peak-n", type=int, default=8192, help="matmul size of the measured peak")
    p.add_argument("--datasheet-tflops", type=float, default=989.0, help="dense bf16 peak")
    p.add_argument("--json", default=None, help="write the numbers here")
    a = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("gpu_mfu.py needs a CUDA GPU; on CPU use python -m benchmarks.train_step")
    peak = measured_peak(a.peak_n)
    r = train_mfu(a)
    r.update(
        gpu=torch.cuda.get_device_name(),
        peak_flops_measured=peak,
        peak_flops_datasheet=a.datasheet_tflops * 1e12,
        mfu=r["achieved_flops"] / (a.datasheet_tflops * 1e12),
        mfu_vs_measured_peak=r["achieved_flops"] / peak,
    )
    print(
        f"{r['gpu']}: {r['params'] / 1e6:.0f}M params, {r['tokens_per_step']} tokens/step, "
        f"{r['step_s']:.3f} s/step, {r['tokens_per_s']:.0f} tok/s, "
        f"{r['achieved_flops'] / 1e12:.1f} TFLOP/s; MFU {r['mfu']:.3f} of datasheet "
        f"{a.datasheet_tflops:.0f} TFLOP/s, {r['mfu_vs_measured_peak']:.3f} of measured matmul "
        f"peak {peak / 1e12:.0f} TFLOP/s"
    )
    if a.json:
        Path(a.json).write_text(json.dumps(r, indent=2))


if __name__ == "__main__":
    main()
