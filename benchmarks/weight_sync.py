"""Weight sync trainer -> rollout engine: seconds per sync against parameter count.

For the demo's policy (``demo``: models/tiny-base) and random Qwen2s of ``tiny_model.SIZES``
(``3m``, ``100m``; ``demo,3m,100m`` by default) this builds
the trainer exactly as ``megatron-rl train`` does (``Policy`` from the checkpoint's config, HF
weights loaded) and the rollout engine (``--engine``, default ``hf``, the demo's engine), then
times what the RL loop's sync phase does: ``sync_weights(engine, policy.hf_state_dict())``
(Megatron -> HF-layout conversion + the engine's load), ``--repeats`` times, in ``memory`` mode
and through a safetensors file (``disk``). The conversion alone is timed too.

Headline ``seconds``: the default ``rollout.sync_mode`` (``disk``). The fraction of a step: given
``--metrics RUN/metrics.jsonl`` of a demo-config run (run_all.py passes the one ``time_split.py``
made), the disk-mode sync seconds at that run's model size (the measured size whose bytes are
closest: ``demo`` for the demo) over its mean ``time/step_s``; that run's own ``time/sync_s``
share is printed beside it.

    .venv/bin/python -m benchmarks.weight_sync [--sizes test,3m,100m] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.harness import ROOT, read_jsonl, step_rows


def build_policy(model_dir: Path) -> Any:
    """The trainer's Policy for an HF checkpoint, as ``train.runtime.setup_run`` builds it."""
    from dataclasses import replace

    from megatron_rl.config.train import TrainConfig
    from megatron_rl.model import hf_io
    from megatron_rl.model.config import ParallelConfig
    from megatron_rl.model.parallel import init_distributed
    from megatron_rl.model.policy import Policy

    _, mcfg = hf_io.load_hf_config(str(model_dir))
    mcfg = replace(mcfg, hf_path=str(model_dir))
    info = init_distributed(ParallelConfig(), seed=0)
    policy = Policy(mcfg, info, TrainConfig())
    sd, _ = hf_io.load_hf(str(model_dir))
    policy.load_hf_state_dict(sd)
    return policy


def bench_size(size: str, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    from benchmarks.tiny_model import count_parameters, make_tiny_qwen2
    from megatron_rl.model.parallel import destroy_distributed
    from megatron_rl.rollout.build import build_engine
    from megatron_rl.rollout.config import RolloutConfig
    from megatron_rl.rollout.weight_sync import sync_weights

    if size == "demo":  # the demo's own policy, the size a demo step syncs
        model_dir = ROOT / "models" / "tiny-base"
    else:
        model_dir = make_tiny_qwen2(tmp / size, size, seed=0, init_std=0.02)
    policy = build_policy(model_dir)
    engine = build_engine(RolloutConfig(engine=args.engine), str(model_dir), 0)
    try:
        convert, memory, disk = [], [], []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            policy.hf_state_dict()
            convert.append(time.perf_counter() - t0)
            t0 = time.perf_counter()  # what the loop's sync phase pays: convert + load
            sync_weights(engine, policy.hf_state_dict())
            memory.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            d = sync_weights(engine, policy.hf_state_dict(), "disk", tmp / f"sync-{size}")
            disk.append(time.perf_counter() - t0)
    finally:
        engine.shutdown()
        destroy_distributed()
    return {
        "params": count_parameters(model_dir),
        "convert_s": min(convert),
        "memory_s": min(memory),
        "disk_s": min(disk),
        "bytes": d["sync/bytes"],
    }


def demo_fraction(metrics_path: Path, per_size: dict[str, Any]) -> dict[str, Any] | None:
    """Sync seconds at the demo run's model size (default ``disk`` mode) over its mean step."""
    rows = step_rows(read_jsonl(metrics_path))
    if not rows:
        return None
    step_s = sum(r["time/step_s"] for r in rows) / len(rows)
    run_sync = sum(r.get("time/sync_s", 0.0) for r in rows) / len(rows)
    nbytes = rows[-1].get("sync/bytes")
    # the measured size whose weight bytes are closest to the run's
    size = min(per_size, key=lambda s: abs(per_size[s]["bytes"] - (nbytes or 0)))
    return {
        "step_s": step_s,
        "size": size,
        "mode": "disk",
        "fraction": per_size[size]["disk_s"] / step_s,
        "run_sync_fraction": run_sync / step_s,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--sizes", default="demo,3m,100m", help="comma list of tiny_model.SIZES, or demo"
    )
    p.add_argument("--engine", default="hf", help="rollout engine to sync into")
    p.add_argument("--repeats", type=int, default=3, help="syncs per size (best is reported)")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    p.add_argument("--metrics", default=None, help="metrics.jsonl of a demo-config run")
    p.add_argument("--json", default=None, help="write the numbers here")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    out: dict[str, Any] = {"cores": os.cpu_count(), "engine": args.engine, "sizes": {}}
    out["load_avg_1m"] = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes.split(","):
            out["sizes"][size] = bench_size(size, args, Path(tmp))
    out["seconds"] = {s: r["disk_s"] for s, r in out["sizes"].items()}  # the default sync_mode
    out["seconds_mode"] = "disk"
    if args.metrics and Path(args.metrics).is_file():
        out["demo_step"] = demo_fraction(Path(args.metrics), out["sizes"])
    print_table(out)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


def print_table(out: dict[str, Any]) -> None:
    print(
        f"cores={out['cores']} engine={out['engine']} load_avg_1m={out['load_avg_1m']:.1f}; "
        "best of repeats, seconds"
    )
    print(f"{'size':<6}{'params':>10}{'MB':>8}{'convert':>9}{'memory':>9}{'disk':>9}")
    for s, r in out["sizes"].items():
        print(
            f"{s:<6}{r['params'] / 1e6:>9.2f}M{r['bytes'] / 2**20:>8.1f}{r['convert_s']:>9.3f}"
            f"{r['memory_s']:>9.3f}{r['disk_s']:>9.3f}"
        )
    demo = out.get("demo_step")
    if demo:
        print(
            f"demo run: step {demo['step_s']:.2f} s; sync at size {demo['size']} = "
            f"{demo['fraction']:.3%} of a step "
            f"(the run's own sync share {demo['run_sync_fraction']:.3%})"
        )


if __name__ == "__main__":
    main()
