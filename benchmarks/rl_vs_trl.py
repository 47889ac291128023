"""End-to-end GRPO: megatron-rl against TRL's ``GRPOTrainer`` on the same machine, same work.

Two sizes: ``tiny`` (the demo's policy: ``model.hf_path`` of ``configs/demo_cpu.yaml``, with the
demo's LR) and ``m20`` (a random ~20M Qwen2: compute rather than overhead dominates; accuracy is
~0 there and not the point). For each, both tools start from the same HF checkpoint and train on
the same prompts in the same order (the tasks megatron-rl's scheduler plans for each step from
``configs/demo_cpu.yaml``'s domains), rendered by
the same chat template, rewarded by the same verifier and ``compose_reward``. Same group size,
prompts per step, response cap, steps, cosine LR schedule (lr -> min_lr, checked step by step),
Adam betas, grad clip, clip range (0.2 / 0.28), token-mean loss (TRL ``loss_type="dapo"``),
group-std advantages, no KL, fp32, the same torch thread count. megatron-rl runs as the demo
config sets it up (packed micro-batches, in-process HF engine); TRL as its docs recommend on a CPU
(see ``trl_grpo.py``: gradient checkpointing off, ``transformers`` generation).

Step time: the mean interval between consecutive step ends (megatron-rl's ``time/step_s``, TRL's
``on_step_end``), the first step left out as warm-up; both include generation, scoring, training
and the previous step's logging. The per-phase split of each tool is printed side by side.
Each size runs ``repeats`` times, interleaved (megatron-rl, megatron-rl overlapped, TRL, then
again): the headline ``step_time_ratio`` is the synchronous one (megatron-rl generates, then
trains, like TRL), the median over the repeats; ``overlapped.step_time_ratio`` is megatron-rl
with ``rl.off_policy=true`` (one-step off-policy: step t+1 generated in the engine's own process
while step t trains) against the same synchronous TRL runs, labelled as such.
Held-out accuracy: the same greedy sweep (``rl_eval.RLEval``: the same distinct held-out prompts,
the same ``evaluate`` call; megatron-rl's end-of-run sweep, for TRL the HF engine on its final
weights), compared on the domains both report. Response tokens (the ones the loss trains on)
per train-phase second are the throughput both tools share (megatron-rl's packed tokens hold
each group's prompt once; TRL's rows hold it per sample, padded).

Time to +10 held-out points over paired seeds, and the demo recipe beside it, is
``rl_vs_trl_gain.py``; it runs the tiny size here with these settings.

    .venv/bin/python -m benchmarks.rl_vs_trl [--sizes tiny,m20] [--repeats N] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from benchmarks.harness import DEMO_CONFIG as CONFIG
from benchmarks.harness import PHASES, ROOT, read_jsonl, read_summary, step_rows, train
from benchmarks.rl_vs_trl_report import KEYS, print_size

DEMO = yaml.safe_load(CONFIG.read_text())  # the tiny size follows its base model and LR
DEMO_MODEL = str(DEMO["model"]["hf_path"])
SIZES: dict[str, dict[str, Any]] = {  # per size: model, steps, prompts/step, eval tasks, repeats
    "tiny": {"model": DEMO_MODEL, "steps": 10, "prompts": 8, "eval_n": 32, "repeats": 3},
    "m20": {"model": "random:20m", "steps": 4, "prompts": 8, "eval_n": 8, "repeats": 1},
}
DIFFERENCES = [
    "megatron-rl syncs weights to its rollout engine every step (phase sync); TRL generates "
    "with the model it trains, so it has nothing to sync",
    "each tool samples its own completions (own RNG): same prompts, different rollouts",
    "TRL pads each step's batch to its longest prompt and completion (see padded tokens); "
    "megatron-rl packs sequences without padding",
    "megatron-rl applies truncated importance sampling against its engine's log-probs (weight "
    "~1 here: same weights, same numerics); TRL has no separate engine",
    "megatron-rl packs each group's prompt once (shared-prefix rows); TRL computes it per sample",
    "the overlapped ratio is one-step off-policy (samples one policy version old, corrected by "
    "truncated importance sampling) and generates in a second process with its own torch "
    "thread, so it uses two cores where the synchronous runs of both tools use one; TRL's "
    "GRPOTrainer here is synchronous",
    "the time-to-+10 runs of the two tools share the machine (one core each, at once); once one "
    "tool stops, the other runs alone; the demo recipe runs alone and uses both cores",
]


def overrides(spec: dict[str, Any]) -> list[str]:
    """Overrides of configs/demo_cpu.yaml for the megatron-rl run (and its task plan)."""
    return [
        f"output_dir={spec['out']}",
        "run_name=mrl",
        f"seed={spec['seed']}",
        f"model.hf_path={spec['model']}",
        f"train.steps={spec['steps']}",
        f"train.lr={spec['lr']}",
        f"train.min_lr={spec['min_lr']}",
        "train.lr_schedule=cosine",
        "train.warmup_steps=0",
        f"train.threads={spec['threads']}",
        f"rl.prompts_per_step={spec['prompts']}",
        f"rl.group_size={spec['group']}",
        "rl.kl_coef=0.0",
        f"rl.off_policy={str(spec.get('off_policy', False)).lower()}",
        f"eval.every={spec.get('eval_every', 0)}",
        f"eval.samples_per_domain={spec['eval_n']}",
        "eval.train_prompts=0",
        f"rollout.max_new_tokens={spec['max_tokens']}",
        "rollout.engine=hf",
        "scheduler.policy=uniform",
        "scheduler.filter_zero_variance=false",
        "checkpoint.every=0",
        "tracking.wandb=disabled",
        "tracking.progress=false",
    ]


def run_config(spec: dict[str, Any]) -> Any:
    from megatron_rl.config import load_config

    return load_config(CONFIG, overrides(spec))


def plan_tasks(spec: dict[str, Any], cfg: Any, domains: dict[str, Any]) -> list[dict[str, Any]]:
    """The tasks megatron-rl trains on, step by step (same scheduler, seed and cursor)."""
    from megatron_rl.controller.generate import make_tasks
    from megatron_rl.scheduler import DomainInfo, DomainScheduler

    infos = [DomainInfo(d.name, d.tier, list(d.levels), list(d.tags)) for d in domains.values()]
    sched = DomainScheduler(cfg.scheduler, infos, cfg.seed)
    cursor: dict[str, int] = {}
    tasks = []
    for step in range(spec["steps"]):
        specs = sched.plan(step, spec["prompts"])
        tasks += [t.to_dict() for t in make_tasks(specs, domains, cursor, cfg.seed)]
    return tasks


def run_megatron(spec: dict[str, Any]) -> dict[str, Any]:
    """``megatron-rl train`` as a user runs it; numbers come from metrics.jsonl/summary.json."""
    train(CONFIG, overrides(spec), timeout=spec["timeout"])
    return read_run(Path(spec["out"]) / "mrl")


def read_run(run: Path) -> dict[str, Any]:
    """A megatron-rl run's per-step phases, LRs, tokens, accuracies, periodic sweeps, and its
    per-step training reward (mean over the generated samples) and grad norm (before clipping)."""
    rows = step_rows(read_jsonl(run / "metrics.jsonl"))
    summary = read_summary(run)
    steps = [
        {p: r.get(f"time/{p}_s", 0.0) for p in PHASES}
        | {"step": r["time/step_s"], "step_cpu": r["time/step_cpu_s"]}
        for r in rows
    ]
    tokens = sum(r["perf/trained_tokens_per_s"] * r["perf/train_s"] for r in rows)
    evals, train_s = [], 0.0
    for i, r in enumerate(rows):  # training time at each sweep, the sweeps left out
        train_s += r["time/step_s"] - r.get("time/eval_s", 0.0)
        if "eval/mean_accuracy" in r:
            evals.append({"step": i + 1, "train_s": train_s, "mean": r["eval/mean_accuracy"]})
    if summary.get("mean_after") is not None:  # the end-of-run sweep
        evals.append({"step": len(rows), "train_s": train_s, "mean": summary["mean_after"]})
    return {
        "steps": steps,
        "lrs": [r["train/lr"] for r in rows],
        "tokens": {"real": tokens, "padded": tokens,
                   "response": sum(r.get("train/response_tokens", 0.0) for r in rows)},
        "completion_len": [r["rollout/response_len_mean"] for r in rows],
        "accuracy": summary["eval_after"],
        "accuracy_before": summary["eval_before"],
        "mean_before": summary.get("mean_before"),
        "evals": evals,
        "reward": [float(r.get("rollout/reward_mean", math.nan)) for r in rows],
        "grad_norm": [float(r.get("train/grad_norm", math.nan)) for r in rows],
    }  # fmt: skip


def run_trl(spec: dict[str, Any]) -> dict[str, Any]:
    """trl_grpo.py in its own process (same thread count); its RESULT line."""
    path = Path(spec["out"]).parent / "trl_spec.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(spec))
    cmd = [sys.executable, "-m", "benchmarks.trl_grpo", str(path)]
    proc = subprocess.run(
        cmd, cwd=ROOT, timeout=spec["timeout"], stdout=subprocess.PIPE, text=True, check=True
    )
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")][-1]
    return dict(json.loads(line[len("RESULT ") :]))


def summarize(run: dict[str, Any], shared: list[str]) -> dict[str, Any]:
    """Mean step time and phases (first step left out), tokens/s, accuracy on ``shared``."""
    steps = run["steps"][1:] if len(run["steps"]) > 1 else run["steps"]
    n = len(steps)
    phases = {p: sum(s.get(p, 0.0) for s in steps) / n for p in PHASES}
    step_s = sum(s["step"] for s in steps) / n
    step_cpu_s = sum(s.get("step_cpu", 0.0) for s in steps) / n
    per_step_tokens = run["tokens"]["real"] / len(run["steps"])
    per_step_response = run["tokens"].get("response", 0.0) / len(run["steps"])
    return {
        "step_s": step_s,
        "step_cpu_s": step_cpu_s,
        "phases": phases,
        "trained_tokens_per_s": per_step_tokens / max(phases["train"], 1e-9),
        "response_tokens_per_s": per_step_response / max(phases["train"], 1e-9),
        "tokens_per_step_s": per_step_tokens / step_s,
        "padded_token_frac": 1 - run["tokens"]["real"] / max(run["tokens"]["padded"], 1e-9),
        "accuracy": sum(run["accuracy"][d] for d in shared) / max(len(shared), 1),
        "accuracy_per_domain": {d: run["accuracy"][d] for d in shared},
    }


def compare(mrl: dict[str, Any], trl: dict[str, Any]) -> dict[str, Any]:
    shared = sorted(set(mrl["accuracy"]) & set(trl["accuracy"]))
    m, t = summarize(mrl, shared), summarize(trl, shared)
    lr_diff = max(
        (abs(a - b) / b for a, b in zip(mrl["lrs"], trl["lrs"], strict=False)), default=0.0
    )
    both = lambda key: {"megatron_rl": m[key], "trl": t[key]}
    return {
        "step_time_ratio": m["step_s"] / t["step_s"],
        "step_cpu_ratio": m["step_cpu_s"] / t["step_cpu_s"] if t["step_cpu_s"] else float("nan"),
        "speedup": t["step_s"] / m["step_s"],
        **{k: both(k) for k in KEYS},
        "phases": {p: {"megatron_rl": m["phases"][p], "trl": t["phases"][p]} for p in PHASES},
        "padded_token_frac": both("padded_token_frac"),
        "accuracy": both("accuracy"),
        "accuracy_per_domain": both("accuracy_per_domain"),
        "accuracy_before": sum(mrl["accuracy_before"][d] for d in shared) / max(len(shared), 1),
        "shared_domains": shared,
        "lr_max_rel_diff": lr_diff,
        "steps": {"megatron_rl": len(mrl["steps"]), "trl": len(trl["steps"])},
    }


def make_model(name: str, tmp: Path) -> tuple[Path, str]:
    """The size's starting checkpoint: a shipped one, or ``random:<size>`` written to ``tmp``."""
    if not name.startswith("random:"):
        return ROOT / name, name
    from benchmarks.tiny_model import count_parameters, make_tiny_qwen2

    size = name.split(":", 1)[1]
    path = make_tiny_qwen2(tmp / f"model_{size}", size, seed=0, init_std=0.02)
    return path, f"random {size} Qwen2 ({count_parameters(path) / 1e6:.1f}M parameters)"


def base_spec(a: argparse.Namespace, model: Path, size: dict[str, Any]) -> dict[str, Any]:
    spec = {k: getattr(a, k) for k in ("group", "max_tokens", "lr", "min_lr", "threads", "seed")}
    spec.update(model=str(model), timeout=a.timeout, level=0)
    spec.update({k: size[k] for k in ("steps", "prompts", "eval_n")})
    spec.update({k: getattr(a, k) for k in ("steps", "prompts", "eval_n") if getattr(a, k)})
    return spec


def median_index(values: list[float]) -> int:
    """Index of the median (the lower middle one for an even count)."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    return order[(len(values) - 1) // 2]


def run_size(size: str, a: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """``repeats`` interleaved rounds of (megatron-rl, megatron-rl overlapped, TRL)."""
    base = SIZES[size]
    model, label = make_model(base["model"], tmp)
    spec = base_spec(a, model, base)
    load0 = os.getloadavg()[0]
    rounds = []
    for r in range(a.repeats or base["repeats"]):
        out = tmp / size / f"r{r}"
        mrl = run_megatron(dict(spec, out=str(out / "mrl")))
        over = run_megatron(dict(spec, out=str(out / "mrl_op"), off_policy=True))
        trl = run_trl(dict(spec, out=str(out / "trl")))
        rounds.append((compare(mrl, trl), compare(over, trl), mrl, trl))
    ratios = [c["step_time_ratio"] for c, _, _, _ in rounds]
    over_ratios = [o["step_time_ratio"] for _, o, _, _ in rounds]
    res, over, mrl, trl = rounds[median_index(ratios)]
    res["step_time_ratio_repeats"] = ratios
    res["overlapped"] = {
        "label": "megatron-rl one-step off-policy (rl.off_policy=true) / TRL synchronous",
        "step_time_ratio": over_ratios[median_index(over_ratios)],
        "step_time_ratio_repeats": over_ratios,
        "step_s": over["step_s"]["megatron_rl"],
        "phases": {p: v["megatron_rl"] for p, v in over["phases"].items()},
        "accuracy": over["accuracy"]["megatron_rl"],
    }
    res["setup"] = dict(spec, model=label, load_avg_1m=load0, load_avg_1m_end=os.getloadavg()[0])
    res["raw"] = {"megatron_rl": mrl, "trl": trl}
    return res


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="tiny,m20", help=f"comma list of {sorted(SIZES)}")
    p.add_argument("--steps", type=int, default=0, help="optimizer steps (0: the size's default)")
    p.add_argument("--prompts", type=int, default=0, help="prompts per step (0: the size's)")
    p.add_argument("--eval-n", type=int, default=0, help="eval tasks per domain (0: the size's)")
    p.add_argument("--group", type=int, default=8, help="completions per prompt")
    p.add_argument("--max-tokens", type=int, default=24, help="response length cap, tokens")
    demo_lr, demo_min_lr = float(DEMO["train"]["lr"]), float(DEMO["train"]["min_lr"])
    p.add_argument("--lr", type=float, default=demo_lr, help="peak LR (the demo's)")
    p.add_argument("--min-lr", type=float, default=demo_min_lr, help="cosine floor (the demo's)")
    p.add_argument("--threads", type=int, default=1, help="torch threads of each tool")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--timeout", type=float, default=1800, help="seconds per tool and size")
    p.add_argument("--repeats", type=int, default=0, help="interleaved rounds (0: the size's)")
    p.add_argument("--json", default=None, help="write the numbers here")
    a = p.parse_args()
    sizes = [s for s in a.sizes.split(",") if s]
    bad = [s for s in sizes if s not in SIZES]
    if bad:
        raise SystemExit(f"--sizes: unknown size {bad[0]!r}; choose from {sorted(SIZES)}")
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        res: dict[str, Any] = {s: run_size(s, a, Path(tmp)) for s in sizes}
    for s in sizes:
        print_size(s, res[s])
    print("\nDifferences that remain:\n" + "\n".join(f"- {d}" for d in DIFFERENCES))
    res["wall_s"] = time.perf_counter() - t0
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
