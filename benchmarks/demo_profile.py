"""Profile of the demo's RL step: where the train phase's time goes, and FLOPs per trained token.

Runs ``megatron-rl train`` in this process on a pinned copy of the demo config
(``benchmarks/configs/demo_cpu_2026-12-01.yaml``, the demo as it was on 2026-12-01, so the
figure stays comparable while the demo's domains change), 1 torch thread, and profiles the train
phase (``rl_step.train_step``: log-prob/loss forward, backward, optimizer) of steps ``--skip``
onwards with ``torch.profiler``. Prints the top operators by self CPU time, the share in
categories (matmul, attention, optimizer, elementwise/other ops, Python and framework overhead:
wall time not inside any operator), and the model FLOPs of each step per packed token and per
*response* token (the tokens the loss trains on). Only every other step after the warm-up is
profiled; the unprofiled ones give the split of the whole step (``time/*_s``: generate, score,
train, sync, log, other) and the packing time inside it (``build_batches``, timed on every step:
advantages, packing and the DP split, counted in ``other``). With ``rl.kl_coef`` 0 (the demo)
there is no reference model, so no reference forward.

Model FLOPs (as ``train_step.py``, whose ``matmul_params`` counts ``N``):
``6 * N * packed_tokens + 12 * layers * hidden * S2``, where ``S2`` is the sum over attention rows
of the keys each row sees (``sum s_i^2`` for plain packed sequences, ``sum (p + r) * r`` for a
response of ``r`` tokens under a shared prefix of ``p``).

    .venv/bin/python -m benchmarks.demo_profile [--steps 10] [--skip 2] [--override k=v ...]
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

from benchmarks.harness import PHASES as STEP_PHASES
from benchmarks.harness import PINNED_DEMO as PINNED
from benchmarks.harness import read_jsonl, step_rows
from benchmarks.train_step import matmul_params

CATEGORIES = {  # operator name substrings -> category (first match wins)
    "attention": ("scaled_dot_product", "flash_attention", "_efficient_attention", "softmax"),
    "matmul": ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul"),
    "optimizer": ("_foreach", "adam", "Optimizer"),
}


def attention_rows(batch: Any) -> int:
    """Keys seen summed over every query row of a packed batch (the attention FLOPs term)."""
    lens = batch.seq_lens()
    prefix_of = list(getattr(batch, "prefix_of", []) or [-1] * len(lens))
    return sum(s * (s + (lens[p] if p >= 0 else 0)) for s, p in zip(lens, prefix_of, strict=True))


def step_flops(cfg: Any, batches: list[Any]) -> tuple[float, int]:
    """Model FLOPs (forward + backward) of one training step and its packed token count."""
    h = cfg.hidden_size
    n_matmul = matmul_params(cfg)
    tokens = sum(b.num_tokens for b in batches if b.seq_ids)
    rows = sum(attention_rows(b) for b in batches if b.seq_ids)
    return 6.0 * n_matmul * tokens + 12.0 * cfg.num_layers * h * rows, tokens


class Recorder:
    """Wraps ``train_step``: profiles every other call from ``skip`` on (the first of each
    pair), keeps their shapes and FLOPs."""

    def __init__(self, inner: Any, skip: int) -> None:
        self.inner, self.skip, self.calls = inner, skip, 0
        self.self_s: dict[str, float] = {}  # operator -> self CPU seconds, profiled calls
        self.rows: list[dict[str, float]] = []
        self.cpu: list[float] = []  # CPU seconds of this process in each call (all calls)

    def profiled(self, call: int) -> bool:
        """Whether the ``call``-th call (1-based) runs under the profiler."""
        return call > self.skip and (call - self.skip) % 2 == 1

    def __call__(self, policy: Any, cfg: Any, batches: list[Any], *args: Any, **kw: Any) -> Any:
        self.calls += 1
        if not self.profiled(self.calls):
            c0 = time.process_time()
            out = self.inner(policy, cfg, batches, *args, **kw)
            self.cpu.append(time.process_time() - c0)
            return out
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            t0, c0 = time.perf_counter(), time.process_time()
            out = self.inner(policy, cfg, batches, *args, **kw)
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        self.cpu.append(cpu)
        for e in prof.key_averages():
            self.self_s[e.key] = self.self_s.get(e.key, 0.0) + e.self_cpu_time_total / 1e6
        flops, tokens = step_flops(policy.cfg, batches)
        self.rows.append(
            {"wall_s": wall, "cpu_s": cpu, "flops": flops, "packed_tokens": tokens,
             "response_tokens": out["train/response_tokens"], "micro_batches": len(batches)}
        )  # fmt: skip
        return out


def categorize(
    self_s: dict[str, float], wall_s: float
) -> tuple[dict[str, float], list[tuple[str, float]]]:
    """Seconds per category (self CPU time of operators; overhead = wall - all of them).

    Operator times include the profiler's own cost, so the shares are of the profiled wall time.
    """
    spent = {k: 0.0 for k in (*CATEGORIES, "other ops")}
    top = []
    for key, s in self_s.items():
        if s <= 0:
            continue
        top.append((key, s))
        cat = next((c for c, keys in CATEGORIES.items() if any(k in key for k in keys)), None)
        spent[cat or "other ops"] += s
    spent["python/framework overhead"] = max(0.0, wall_s - sum(spent.values()))
    return spent, sorted(top, key=lambda x: -x[1])[:15]


class Clock:
    """Wraps a function: the wall and CPU seconds of each call."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.seconds, self.cpu = inner, [], []

    def __call__(self, *args: Any, **kw: Any) -> Any:
        t0, c0 = time.perf_counter(), time.process_time()
        out = self.inner(*args, **kw)
        self.seconds.append(time.perf_counter() - t0)
        self.cpu.append(time.process_time() - c0)
        return out


PHASES = (*STEP_PHASES, "step")


def step_split(run: Path, rec: Recorder, pack: Clock) -> tuple[dict[str, float], dict[str, float]]:
    """Mean seconds per phase of the unprofiled steps after the warm-up (wall, with packing
    beside them), and this process's CPU seconds of the same steps: the whole step, the train
    phase, packing, and the rest (generation in this process, scoring, sync, logging)."""
    rows = step_rows(read_jsonl(run / "metrics.jsonl"))
    keep = [i for i in range(len(rows)) if i >= rec.skip and not rec.profiled(i + 1)]
    mean = lambda xs: sum(xs[i] for i in keep if i < len(xs)) / len(keep)
    wall = {p: mean([r.get(f"time/{p}_s", 0.0) for r in rows]) for p in PHASES}
    wall.update({"packing (in other)": mean(pack.seconds), "steps": float(len(keep))})
    cpu = {"step": mean([r["time/step_cpu_s"] for r in rows]), "train": mean(rec.cpu),
           "packing": mean(pack.cpu)}  # fmt: skip
    cpu["rest"] = cpu["step"] - cpu["train"] - cpu["packing"]
    return wall, cpu


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default=str(PINNED), help="run config (default: the pinned demo)")
    p.add_argument("--steps", type=int, default=10, help="RL steps to run")
    p.add_argument("--skip", type=int, default=2, help="steps before profiling starts (warm-up)")
    p.add_argument("--override", nargs="*", default=[], help="extra config overrides (a.b=c)")
    p.add_argument("--json", default=None, help="write the numbers here")
    a = p.parse_args()
    from megatron_rl.config import load_config
    from megatron_rl.controller import controller
    from megatron_rl.train import rl

    rec = Recorder(rl.train_step, a.skip)
    rl.train_step = rec  # the loop calls it through the module attribute
    pack = Clock(controller.build_batches)
    controller.build_batches = pack
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(a.config, [
            f"output_dir={tmp}", "run_name=profile", f"train.steps={a.steps}", "train.threads=1",
            "eval.every=0", "eval.samples_per_domain=4", "checkpoint.every=0",
            "tracking.wandb=disabled", "tracking.progress=false", *a.override,
        ])  # fmt: skip
        rl.train_rl(cfg)
        split, split_cpu = step_split(Path(tmp) / "profile", rec, pack)
    n = len(rec.rows)
    mean = {k: sum(r[k] for r in rec.rows) / n for k in rec.rows[0]}
    spent, top = categorize(rec.self_s, mean["wall_s"] * n)
    res = {
        "config": a.config,
        "overrides": a.override,
        "load_avg_1m": os.getloadavg()[0],
        "profiled_steps": n,
        "per_step": mean,
        "flops_per_packed_token": mean["flops"] / mean["packed_tokens"],
        "flops_per_response_token": mean["flops"] / mean["response_tokens"],
        "response_tokens_per_s": mean["response_tokens"] / mean["wall_s"],
        "achieved_gflops": mean["flops"] / mean["wall_s"] / 1e9,
        "step_split_s": split,
        "step_cpu_split_s": split_cpu,
        "share": {k: v / (mean["wall_s"] * n) for k, v in spent.items()},
        "top_ops": [(k, s / n) for k, s in top],
    }
    print(f"train phase, {n} steps (after {a.skip} warm-up), load avg {res['load_avg_1m']:.1f}:")
    m = res["per_step"]
    print(f"  {m['wall_s']:.3f} s wall / {m['cpu_s']:.3f} s CPU per step, {m['micro_batches']:.1f} "
          f"micro-batches, {m['packed_tokens']:.0f} packed / {m['response_tokens']:.0f} response "
          f"tokens, {res['achieved_gflops']:.2f} GFLOP/s")  # fmt: skip
    print(f"  model FLOPs per packed token {res['flops_per_packed_token']:.3g}, per response "
          f"token {res['flops_per_response_token']:.3g}; response tokens/s "
          f"{res['response_tokens_per_s']:.0f}")  # fmt: skip
    print(f"  the step, {split['steps']:.0f} unprofiled steps (mean s): " + ", ".join(
        f"{k} {v:.3f}" for k, v in split.items() if k != "steps"))  # fmt: skip
    print("  the same steps, CPU s of this process: " + ", ".join(
        f"{k} {v:.3f}" for k, v in split_cpu.items()))  # fmt: skip
    print("  train phase of the profiled steps, share of wall time:")
    for k, v in res["share"].items():
        print(f"  {k:<28}{v:>7.1%}")
    print("  top operators (self CPU s per step):")
    for k, s in res["top_ops"]:
        print(f"    {k:<44}{s:>8.4f}")
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
