"""Uniform mixing vs the adaptive domain scheduler on the simulator, plus scheduler overhead.

    python benchmarks/scheduler_sim.py            # 5 seeds, 200 domains, ~2-3 min on 2 cores
    python benchmarks/scheduler_sim.py --seeds 2  # quicker

Prints, per scheduler configuration and simulator setting, the mean over seeds of: mean final
eval accuracy, worst-domain final accuracy, mean of the 10 worst domains, the number of domains
that ended more than 2 points below their best, and groups generated per step. Accuracies are
the simulator's noise-free expected eval accuracy (ground truth), which the scheduler never
sees: it only gets rollout results and noisy eval scores. Then times plan + observe + select
per step with 1,000 domains.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import replace

import numpy as np

from megatron_rl.scheduler import SchedulerConfig
from megatron_rl.scheduler.scheduler import DomainScheduler
from megatron_rl.scheduler.sim import DomainSim, SimConfig, simulate

ADAPTIVE = SchedulerConfig(
    policy="target_difficulty",
    floor=0.0025,  # half of the uniform share of 200 domains
    target_min_score=0.3,
    curriculum=True,
    filter_zero_variance=True,
    oversample=2.0,
    seesaw=True,
    lag_boost=5.0,  # tried 5 and 10 on seeds 0-4; 10 doubled the regression count
)
CONFIGS = {  # name -> (scheduler config, trained groups per step as a multiple of --groups)
    "uniform": (SchedulerConfig(), 1),
    "uniform, 2x batch": (SchedulerConfig(), 2),  # same rollouts/step as the filtered runs
    "uniform + zero-var filter": (SchedulerConfig(filter_zero_variance=True, oversample=2.0), 1),
    "learning_progress (floor)": (SchedulerConfig(policy="learning_progress", floor=0.0025), 1),
    "target_difficulty (floor)": (SchedulerConfig(policy="target_difficulty", floor=0.0025), 1),
    "adaptive, no seesaw guard": (replace(ADAPTIVE, seesaw=False), 1),
    "adaptive, no lag boost": (replace(ADAPTIVE, lag_boost=0.0), 1),
    "adaptive, neither guard": (replace(ADAPTIVE, seesaw=False, lag_boost=0.0), 1),
    "adaptive (all features)": (ADAPTIVE, 1),
}
SETTINGS = {
    "default": SimConfig(),
    "no interference": SimConfig(cross_mean=0.0, cross_std=0.0, conflict_frac=0.0),
}


def run_seeds(name: str, sim_cfg: SimConfig, args: argparse.Namespace) -> np.ndarray:
    """[seeds, 5]: mean acc, worst, mean of 10 worst, #regressions, rollouts per step."""
    cfg, mult = CONFIGS[name]
    rows = []
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        out = simulate(cfg, sim_cfg, seed, steps=args.steps, num_groups=args.groups * mult)
        worst10 = np.sort(out.final)[:10].mean()
        rows.append(
            (out.final.mean(), out.final.min(), worst10, out.regressions, out.rollouts / args.steps)
        )
    return np.array(rows, dtype=float)


def compare(args: argparse.Namespace) -> None:
    print(
        f"{'setting':16s} {'scheduler':26s} {'mean acc':>8s} {'worst':>6s} {'worst10':>7s} "
        f"{'#regr':>5s} {'rollouts/step':>13s}"
    )
    for setting, sim_cfg in SETTINGS.items():
        names = list(CONFIGS) if setting == "default" else ["uniform", "adaptive (all features)"]
        runs = {}
        for name in names:
            runs[name] = run_seeds(name, sim_cfg, args)
            m = runs[name].mean(axis=0)
            print(
                f"{setting:16s} {name:26s} {m[0]:8.3f} {m[1]:6.3f} {m[2]:7.3f} {m[3]:5.1f} "
                f"{m[4]:13.0f}",
                flush=True,
            )
        start = DomainSim(sim_cfg, args.first_seed).expected_eval()
        label = f"(at start, seed {args.first_seed})"
        print(
            f"{setting:16s} {label:26s} {start.mean():8.3f} {start.min():6.3f} "
            f"{np.sort(start)[:10].mean():7.3f}"
        )
        uni, ada = runs["uniform"], runs["adaptive (all features)"]
        print(
            f"{setting:16s} per seed, adaptive vs uniform: higher mean acc "
            f"{(ada[:, 0] > uni[:, 0]).sum()}/{len(uni)}, higher worst "
            f"{(ada[:, 1] > uni[:, 1]).sum()}/{len(uni)}, fewer regressions "
            f"{(ada[:, 3] < uni[:, 3]).sum()}/{len(uni)} (ties {(ada[:, 3] == uni[:, 3]).sum()})"
        )


def overhead(n_domains: int, num_groups: int, steps: int) -> None:
    sim = DomainSim(replace(SimConfig(), n_domains=n_domains, n_clusters=20), seed=0)
    sched = DomainScheduler(replace(ADAPTIVE, floor=0.5 / n_domains), sim.domains(), seed=0)
    spent = []
    for step in range(steps):
        t0 = time.perf_counter()
        specs = sched.plan(step, num_groups)
        t1 = time.perf_counter()
        results = sim.rollout(specs)
        t2 = time.perf_counter()
        sched.observe(step, results)
        kept = sched.select(results, num_groups)
        spent.append((t1 - t0) + (time.perf_counter() - t2))
        sim.train([results[k] for k in kept])
    scores = sim.eval_scores()
    t0 = time.perf_counter()
    sched.observe_eval(steps, scores)
    sweep = time.perf_counter() - t0
    t0 = time.perf_counter()
    sched.metrics()
    metrics_s = time.perf_counter() - t0
    ms = 1e3 * np.array(spent[5:])
    print(
        f"\noverhead, {n_domains} domains, {num_groups} groups/step (+{num_groups} refill), "
        f"{os.cpu_count()} cores: plan+observe+select median {np.median(ms):.2f} ms/step "
        f"(p90 {np.percentile(ms, 90):.2f} ms); eval sweep "
        f"({sim.cfg.eval_tasks} tasks/domain) {1e3 * sweep:.0f} ms; "
        f"metrics() {1e3 * metrics_s:.0f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--first-seed", type=int, default=0, help="e.g. 5 for held-out seeds")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--groups", type=int, default=64, help="trained groups per step")
    args = parser.parse_args()
    t0 = time.time()
    print(
        f"simulator: {SimConfig().n_domains} domains, {args.steps} steps, {args.groups} "
        f"groups/step, seeds {args.first_seed}..{args.first_seed + args.seeds - 1} "
        "(means over seeds)\n"
    )
    compare(args)
    overhead(1000, args.groups, 50)
    print(f"total {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
