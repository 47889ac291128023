"""Peak memory of one training step vs sequence length, with and without recomputation.

Each point runs in a fresh subprocess: build the ``Policy`` (megatron-core GPTModel of the
``ModelConfig`` defaults, 4 layers x 256, DDP + Adam) with ``model.recompute`` set, record the
resident set size (RSS), run one ``forward_backward`` on one sequence of ``L`` tokens plus one
``optimizer_step``, and read the process's peak RSS (``ru_maxrss``). The number reported is
``peak - RSS before the step``: what the step itself needed on top of the model and framework.
Model build happens before the baseline; its transient allocations (a few MB for this size) are
below the step peaks measured here.

Recompute modes (``ModelConfig.recompute``, mapped to Megatron in ``megatron_rl/model/gpt.py``):
``none``; ``selective`` (core attention recomputed); ``full`` (every layer's input kept, the
layer recomputed in backward).

On CPU the local attention is dense under a mask, so the attention scores ([heads, L, L] per
layer) dominate at long lengths; with TE's fused attention on a GPU they would not be stored.

    .venv/bin/python -m benchmarks.memory [--lengths 1024 2048 4096] [--out benchmarks/out]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.harness import OUT, ROOT

MODES = ("none", "selective", "full")


def one_point(length: int, recompute: str, threads: int) -> dict[str, float]:
    """Run in the child: one training step at ``length`` tokens; returns MiB and seconds."""
    import psutil
    import torch

    from megatron_rl.config.train import TrainConfig
    from megatron_rl.model.config import ModelConfig, ParallelConfig
    from megatron_rl.model.parallel import init_distributed
    from megatron_rl.model.policy import Policy
    from megatron_rl.packing.batch import pack

    torch.set_num_threads(threads)
    cfg = ModelConfig(recompute=recompute, max_position_embeddings=max(2048, length))  # type: ignore[arg-type]
    info = init_distributed(ParallelConfig(), seed=0)
    policy = Policy(cfg, info, TrainConfig())
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(cfg.vocab_size, (length,), generator=g).tolist()
    batch = pack([tokens], [[1.0] * length])

    def loss_fn(b, logprobs, entropy):  # type: ignore[no-untyped-def]
        return -(logprobs * b.loss_mask).sum() / b.loss_mask.sum(), {}

    base = psutil.Process().memory_info().rss
    t0 = time.perf_counter()
    policy.forward_backward([batch], loss_fn)
    policy.optimizer_step(1e-4)
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    return {"step_peak_mib": (peak - base) / 2**20, "base_mib": base / 2**20, "seconds": seconds}


def run_point(length: int, recompute: str, threads: int, timeout: float) -> dict[str, float]:
    cmd = [
        sys.executable,
        "-W",
        "ignore",
        "-m",
        "benchmarks.memory",
        "--child",
        str(length),
        recompute,
        "--threads",
        str(threads),
    ]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"error": f"over {timeout:.0f} s"}  # type: ignore[dict-item]
    if out.returncode != 0:
        return {"error": out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "failed"}  # type: ignore[dict-item]
    return json.loads(out.stdout.strip().splitlines()[-1])


def plot(results: dict[str, dict[int, dict[str, float]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for mode, points in results.items():
        ok = sorted((n, p["step_peak_mib"]) for n, p in points.items() if "step_peak_mib" in p)
        if ok:
            ax.plot([n for n, _ in ok], [m for _, m in ok], marker="o", label=f"recompute={mode}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length (tokens)")
    ax.set_ylabel("peak memory of one step (MiB, RSS)")
    ax.set_title("tiny policy (4x256), one training step, CPU fp32")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096])
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=600, help="seconds per point")
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--child", nargs=2, metavar=("LENGTH", "MODE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(one_point(int(args.child[0]), args.child[1], args.threads)))
        return 0
    print(f"machine: {os.cpu_count()} cores, torch threads {args.threads}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # Points accumulate in memory.json across invocations (re-measured points are replaced), so
    # long lengths can be run separately and the plot still shows every length.
    store = out / "memory.json"
    saved = json.loads(store.read_text()) if store.is_file() else {}
    results: dict[str, dict[int, dict[str, float]]] = {
        m: {int(n): p for n, p in saved.get(m, {}).items()} for m in MODES
    }
    for length in args.lengths:
        for mode in args.modes:
            r = run_point(length, mode, args.threads, args.timeout)
            results[mode][length] = r
            store.write_text(json.dumps(results, indent=1))
            text = (
                f"{r['step_peak_mib']:8.1f} MiB  {r['seconds']:6.1f} s"
                if "step_peak_mib" in r
                else f"failed: {r['error']}"
            )
            print(f"L={length:6d} recompute={mode:9s} {text}", flush=True)
    for length in args.lengths:
        none, full = results.get("none", {}).get(length), results.get("full", {}).get(length)
        if none and full and "step_peak_mib" in none and "step_peak_mib" in full:
            print(
                f"L={length}: full recompute uses "
                f"{full['step_peak_mib'] / none['step_peak_mib']:.2f}x the memory of none"
            )
    plot(results, out / "memory.png")
    print(f"wrote {out / 'memory.png'} and {out / 'memory.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
