"""Generated tokens/s of the rollout engines against plain ``transformers`` generate.

For each model size, one run of each: the baseline (``model.generate`` on the batch of
prompts x n, sampling at T=1), the ``hf`` engine and the ``vllm`` engine on the same requests
(16 prompts x n=8 x up to 64 new tokens by default), then the weight-update time of each engine
(in memory and through a safetensors file). Models are random Qwen2s (tiny_model.SIZES): '3m'
(hidden 256, 4 layers, 4 heads of 64, vocab 320) and '100m' (hidden 768, 12 layers).

    .venv/bin/python -m benchmarks.rollout_engines --sizes 3m,100m

Prints one table per size with tokens/s and the ratio to the baseline, plus the machine's core
count, torch threads and load average (other processes on a shared machine skew all numbers;
the ratios, measured side by side, less so). Add ``--json PATH`` to keep the numbers.
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
from transformers import AutoModelForCausalLM

from benchmarks.tiny_model import count_parameters, make_tiny_qwen2
from megatron_rl.rollout.base import GenRequest, RolloutEngine, SamplingParams
from megatron_rl.rollout.build import build_engine
from megatron_rl.rollout.config import RolloutConfig
from megatron_rl.rollout.weight_sync import sync_weights


def make_requests(num_prompts: int, n: int, max_tokens: int, prompt_len: int) -> list[GenRequest]:
    return [
        GenRequest(
            [(13 * i + 7 * j) % 250 for j in range(prompt_len)],
            SamplingParams(temperature=1.0, max_tokens=max_tokens, n=n, seed=i),
        )
        for i in range(num_prompts)
    ]


@torch.inference_mode()
def run_baseline(model_dir: Path, reqs: list[GenRequest]) -> dict[str, float]:
    """transformers ``generate``: every sample is its own row (no prefix sharing)."""
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    eos = int(model.generation_config.eos_token_id)
    rows = [r.prompt_ids for r in reqs for _ in range(r.params.n)]
    width = max(len(p) for p in rows)
    ids = torch.full((len(rows), width), eos, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(rows):
        ids[i, width - len(p) :], mask[i, width - len(p) :] = torch.tensor(p), 1
    torch.manual_seed(0)
    start = time.perf_counter()
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        max_new_tokens=reqs[0].params.max_tokens,
        pad_token_id=eos,
        eos_token_id=eos,
    )
    seconds = time.perf_counter() - start
    new = out[:, width:]
    # tokens up to and including the first EOS of each row
    ended = (new == eos).long().cumsum(dim=1)
    tokens = int(((ended == 0) | ((ended == 1) & (new == eos))).sum())
    return {"seconds": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds}


def run_engine(name: str, model_dir: Path, reqs: list[GenRequest], sync_dir: Path) -> dict:
    cfg = RolloutConfig(engine=name, kv_cache_gb=4, max_batch=256)
    start = time.perf_counter()
    engine = build_engine(cfg, str(model_dir), seed=0)
    startup = time.perf_counter() - start
    try:
        engine.generate(reqs[:2])  # warm-up (first-call allocations, kernel selection)
        start = time.perf_counter()
        out = engine.generate(reqs)
        seconds = time.perf_counter() - start
        tokens = sum(len(c.token_ids) for cs in out for c in cs)
        return {
            "startup_s": startup,
            "seconds": seconds,
            "tokens": tokens,
            "tokens_per_s": tokens / seconds,
            "cached_prompt_tokens": engine.stats.get("rollout/cached_prompt_tokens", 0.0),
            **weight_update_times(engine, model_dir, sync_dir),
        }
    finally:
        engine.shutdown()


def weight_update_times(engine: RolloutEngine, model_dir: Path, sync_dir: Path) -> dict:
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    state = {k: v * 1.01 for k, v in model.state_dict().items()}
    memory = sync_weights(engine, state, mode="memory")
    disk = sync_weights(engine, state, mode="disk", dir=sync_dir)
    return {
        "update_memory_s": memory["sync/seconds"],
        "update_disk_s": disk["sync/seconds"],
        "update_disk_write_s": disk["sync/write_seconds"],
        "weights_mb": memory["sync/bytes"] / 2**20,
    }


def bench_size(size: str, engines: list[str], args: argparse.Namespace, tmp: Path) -> dict:
    model_dir = make_tiny_qwen2(tmp / size, size, seed=0, init_std=0.02)
    reqs = make_requests(args.prompts, args.n, args.max_tokens, args.prompt_len)
    result: dict[str, Any] = {"params": count_parameters(model_dir)}
    result["transformers"] = run_baseline(model_dir, reqs)
    for name in engines:
        result[name] = run_engine(name, model_dir, reqs, tmp / f"sync-{size}-{name}")
    return result


def print_table(size: str, res: dict, engines: list[str]) -> None:
    base = res["transformers"]["tokens_per_s"]
    print(f"\n== {size}: {res['params'] / 1e6:.1f}M parameters ==")
    print(
        f"{'engine':<14}{'tok/s':>9}{'vs base':>9}{'tokens':>8}{'start s':>9}"
        f"{'upd mem s':>11}{'upd disk s':>11}"
    )
    print(f"{'transformers':<14}{base:>9.1f}{1.0:>9.2f}{res['transformers']['tokens']:>8}")
    for name in engines:
        r = res[name]
        print(
            f"{name:<14}{r['tokens_per_s']:>9.1f}{r['tokens_per_s'] / base:>9.2f}{r['tokens']:>8}"
            f"{r['startup_s']:>9.1f}{r['update_memory_s']:>11.3f}{r['update_disk_s']:>11.3f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="3m,100m", help="comma list of tiny_model.SIZES")
    parser.add_argument("--engines", default="hf,vllm", help="comma list of engines")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=48, help="prompt tokens")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--json", default=None, help="also write the numbers here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    engines = [e for e in args.engines.split(",") if e]
    load_before = os.getloadavg()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes.split(","):
            results[size] = bench_size(size, engines, args, Path(tmp))
    print(
        f"\ncores={os.cpu_count()} torch_threads={args.threads} "
        f"load_avg_1m before={load_before[0]:.1f} after={os.getloadavg()[0]:.1f}; "
        f"{args.prompts} prompts x n={args.n} x <= {args.max_tokens} tokens, "
        f"prompt {args.prompt_len} tokens"
    )
    for size, res in results.items():
        print_table(size, res, engines)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
