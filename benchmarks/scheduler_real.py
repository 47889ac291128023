"""The domain scheduler in real training: adaptive vs uniform mixing (``make bench-scheduler``).

Every arm trains the shipped base model (``models/tiny-base``) with the demo's RL settings on
the same 12 domains (``DOMAINS``: the demo's four ``tiny/*`` plus eight ``tinymix/*``, greedy
start accuracy 0.15-0.90, including the constructed interfering pair ``tinymix/add`` /
``tinymix/add_last_digit``), for the same steps, with the same rollout budget: every arm runs
the zero-variance filter with ``oversample: 2``, so every arm generates the same number of
groups per step. That is checked twice: from the configs before anything runs, and from each
run's ``rollout/samples`` afterwards; a mismatch raises.

Arms: ``uniform + zero-var filter`` (the same-budget baseline), ``adaptive`` (target-difficulty
mix, curriculum, seesaw guard with a temperature bump, lag boost, diversity-driven per-domain
temperature), and two ablations: ``adaptive, no seesaw guard`` and ``adaptive, fixed
temperature``. The adaptive settings were written down before any run of this benchmark.

Seeds: ``REPORT_SEEDS`` were fixed in this file before any tuning and are the only ones to
quote; ``DEV_SEEDS`` are for development and smoke runs and are reported in a separate section
of the JSON. Per arm and seed the JSON holds, from the run's own per-domain held-out curves
(greedy, fixed level-0 eval set): mean and worst-domain final accuracy, regressions (domains
ending more than 2 points below their own best sweep), generated groups per step, wall time.
It also draws ``<out>_radar.png`` (final accuracy per domain, one line per arm, mean over
seeds) and ``<out>_curves.png`` (mean held-out accuracy against step per arm); each run's
directory has its own ``radar.png`` and ``eval_curves.png``; W&B gets every run and a summary.
With report seeds it draws docs/scheduler_seesaw.png from the first adaptive run whose guard
flagged a domain (of the constructed pair if any), its no-guard twin dashed (``draw_seesaw``).

A second experiment (``--experiment temperature``; both run by default) asks whether the
per-domain temperature pays: two low-signal domains, uniform mix, T = 1 fixed vs the diversity
controller, same budget and seeds; it goes to the JSON's ``temperature`` section and
``<out>_temperature.png``.

    .venv/bin/python benchmarks/scheduler_real.py                 # both experiments, 3 seeds
    .venv/bin/python benchmarks/scheduler_real.py --smoke --out /tmp/s.json --run-dir /tmp/r
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from scheduler_report import draw, draw_temperature, log_wandb, table, temperature_table  # noqa: E402

CONFIG = ROOT / "configs" / "demo_cpu.yaml"
DOMAINS = [
    "tiny/basic_arithmetic",
    "tiny/chain_sum",
    "tiny/count_bits",
    "tiny/letter_counting",
    "tinymix/add",
    "tinymix/add_last_digit",
    "tinymix/sub",
    "tinymix/count_bits_8bit",
    "tinymix/equations",
    "tinymix/lcm",
    "tinymix/letter_counting_2words",
    "tinymix/letter_counting_long",
]
REPORT_SEEDS = (11, 12, 13)  # fixed 2026-12-01 before any run of this benchmark; never tuned on
DEV_SEEDS = (1,)  # the demo's seed: development and smoke runs
REGRESSION_POINTS = 0.02  # a domain "regressed" if it ends more than this below its own best
BUDGET = ["scheduler.filter_zero_variance=true", "scheduler.oversample=2.0"]  # every arm
ADAPTIVE = [
    *BUDGET,
    "scheduler.policy=target_difficulty",
    "scheduler.floor=0.04",  # half the uniform share of 12 domains
    "scheduler.target_min_score=0.3",
    "scheduler.curriculum=true",
    "scheduler.seesaw=true",
    "scheduler.seesaw_temperature_scale=1.2",  # a flagged domain explores more
    "scheduler.lag_boost=5.0",
    "scheduler.temperature_adapt=diversity",
    "scheduler.temperature_target=0.6",  # share of groups with reward variance
    "scheduler.temperature_min=0.6",
    "scheduler.temperature_max=1.5",
]
Arms = dict[str, list[str]]  # arm name -> config overrides
ARMS: Arms = {  # arm -> config overrides on top of the demo config
    "uniform + zero-var filter": [*BUDGET, "scheduler.policy=uniform"],
    "adaptive": ADAPTIVE,
    "adaptive, no seesaw guard": [*ADAPTIVE, "scheduler.seesaw=false"],
    "adaptive, fixed temperature": [*ADAPTIVE, "scheduler.temperature_adapt=none"],
}
# Does the per-domain temperature pay? Two domains whose 8-sample groups mostly carry no signal
# at T=1 (tiny_headroom.py, dev seed 1: share of groups with reward variance 0.35, mostly
# all-pass; 0.33, mostly all-fail), uniform mix for both arms so only the temperature differs.
TEMPERATURE_DOMAINS = ["tiny/letter_counting", "tinymix/equations"]
TEMPERATURE_ARMS: Arms = {
    "T=1 fixed": [*BUDGET, "scheduler.policy=uniform"],
    "per-domain T (diversity)": [
        *BUDGET,
        "scheduler.policy=uniform",
        *[o for o in ADAPTIVE if o.startswith("scheduler.temperature")],
    ],
}
EXPERIMENTS = {  # name -> (arms, domains, held-out tasks per domain)
    "mix": (ARMS, DOMAINS, 64),
    "temperature": (TEMPERATURE_ARMS, TEMPERATURE_DOMAINS, 128),
}


def slug(arm: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in arm).strip("_").replace("__", "_")


def overrides(
    arm: str,
    seed: int,
    a: argparse.Namespace,
    run_dir: Path,
    arms: Arms | None = None,
) -> list[str]:
    """Everything but the arm's scheduler settings is the same for every arm."""
    arms = ARMS if arms is None else arms
    return [
        f"output_dir={run_dir}",
        f"run_name={slug(arm)}-s{seed}",
        f"seed={seed}",
        f"model.hf_path={a.model}",
        f"domains.include={json.dumps(a.domains)}",
        "domains.exclude=[]",
        "domains.level=0",
        f"train.steps={a.steps}",
        "train.threads=1",
        f"rl.prompts_per_step={a.prompts}",
        f"rl.group_size={a.group}",
        f"rl.eval_every={a.eval_every}",
        f"rl.eval_samples_per_domain={a.eval_n}",
        "checkpoint.every=0",
        f"tracking.wandb={a.wandb}",
        "tracking.progress=false",
        *arms[arm],
    ]


def planned_groups(
    a: argparse.Namespace, run_dir: Path, arms: Arms | None = None
) -> dict[str, int]:
    """Generated groups per step of every arm, from its resolved config; all must be equal."""
    from megatron_rl.config import load_config

    arms = ARMS if arms is None else arms
    out = {}
    for arm in arms:
        cfg = load_config(CONFIG, overrides(arm, 0, a, run_dir, arms))
        n = cfg.rl.prompts_per_step
        s = cfg.scheduler
        out[arm] = math.ceil(n * s.oversample) if s.filter_zero_variance else n
    if len(set(out.values())) != 1:
        raise ValueError(f"arms generate different groups per step: {out}")
    return out


def run_one(arm: str, seed: int, a: argparse.Namespace, run_dir: Path, arms: Arms) -> Path:
    cmd = [sys.executable, "-m", "launch.cli", "train", str(CONFIG)]
    cmd += overrides(arm, seed, a, run_dir, arms)
    out = run_dir / f"{slug(arm)}-s{seed}"
    shutil.rmtree(out, ignore_errors=True)  # a fresh run: the CLI would resume an old one
    out.mkdir(parents=True)
    with (out / "bench_stdout.txt").open("w") as log:
        proc = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, check=False)
    if proc.returncode != 0:
        tail = (out / "bench_stdout.txt").read_text()[-2000:]
        raise RuntimeError(f"{arm} seed {seed} failed (rc {proc.returncode}):\n{tail}")
    return out


def score_run(run: Path, group_size: int) -> dict[str, Any]:
    """Numbers of one run, from its own metrics.jsonl (eval curves) and summary.json."""
    from megatron_rl.scheduler.curves import curve_data, read_jsonl

    curves = curve_data(run).curves
    final = {d: pts[-1][1] for d, pts in curves.items()}
    best = {d: max(v for _, v in pts) for d, pts in curves.items()}
    start = {d: pts[0][1] for d, pts in curves.items()}
    metrics = read_jsonl(run / "metrics.jsonl")
    rows = [r for r in metrics if "rollout/samples" in r]
    summary = json.loads((run / "summary.json").read_text())
    return {
        "mean_acc": float(np.mean(list(final.values()))),
        "worst_acc": float(min(final.values())),
        "regressions": sum(final[d] < best[d] - REGRESSION_POINTS for d in final),
        "rollouts_per_step": float(np.mean([r["rollout/samples"] for r in rows]) / group_size),
        "wall_s": float(summary["wall_s"]),
        "start_mean_acc": float(np.mean(list(start.values()))),
        "final": final,
        "start": start,
        "best": best,
        "curves": curves,
        "mixed_share": mixed_share(metrics, list(final)),
        "mean_temperature": mean_metric(metrics, list(final), "temperature"),
        "regressed": sorted(d for d in final if final[d] < best[d] - REGRESSION_POINTS),
        "seesaw_events": [
            e
            for e in read_jsonl(run / "events.jsonl")
            if e.get("event") in ("regression", "recovery")
        ],
        "run_dir": str(run),
    }


def mixed_share(rows: list[dict[str, Any]], domains: list[str]) -> dict[str, float]:
    """Per domain, the run's mean share of groups with reward variance (1 - zero_var_frac)."""
    return {d: 1.0 - v for d, v in mean_metric(rows, domains, "zero_var_frac").items()}


def mean_metric(rows: list[dict[str, Any]], domains: list[str], name: str) -> dict[str, float]:
    """Per domain, the run's mean of ``sched/<domain>/<name>`` (e.g. the sampling temperature)."""
    out = {}
    for d in domains:
        v = [r[f"sched/{d}/{name}"] for r in rows if f"sched/{d}/{name}" in r]
        if v:
            out[d] = float(np.mean(v))
    return out


def run_all(
    a: argparse.Namespace, seeds: tuple[int, ...], run_dir: Path, arms: Arms
) -> dict[str, Any]:
    jobs = [(arm, s) for s in seeds for arm in arms]

    def attempt(job: tuple[str, int]) -> Path | Exception:
        try:
            return run_one(job[0], job[1], a, run_dir, arms)
        except RuntimeError as e:  # the other runs go on; all failures are raised at the end
            print(e, file=sys.stderr, flush=True)
            return e

    with ThreadPoolExecutor(max_workers=a.jobs) as pool:
        done = list(pool.map(attempt, jobs))
    failed = [
        f"{arm} seed {s}" for (arm, s), d in zip(jobs, done, strict=True) if not isinstance(d, Path)
    ]
    if failed:
        raise RuntimeError(
            f"{len(failed)} of {len(jobs)} runs failed: {failed} (logs in {run_dir})"
        )
    dirs = [d for d in done if isinstance(d, Path)]
    results: dict[str, Any] = {arm: {} for arm in arms}
    for (arm, seed), d in zip(jobs, dirs, strict=True):
        results[arm][str(seed)] = score_run(d, a.group)
    per_step = {r["rollouts_per_step"] for arm in results.values() for r in arm.values()}
    if len(per_step) != 1:
        raise RuntimeError(f"measured generated groups per step differ across runs: {per_step}")
    return results


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--experiment", choices=["all", *EXPERIMENTS], default="all")
    ap.add_argument("--seeds", choices=["report", "dev"], default="report")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--prompts", type=int, default=16, help="trained groups per step")
    ap.add_argument("--group", type=int, default=8, help="completions per group")
    ap.add_argument("--eval-every", type=int, default=25)
    ap.add_argument("--eval-n", type=int, help="held-out tasks per domain [per experiment]")
    ap.add_argument("--jobs", type=int, default=2, help="runs at once (1 torch thread each)")
    ap.add_argument("--model", default=str(ROOT / "models" / "tiny-base"))
    ap.add_argument("--domains", nargs="+", help="the mix experiment's domains (default: DOMAINS)")
    ap.add_argument("--wandb", default="auto", choices=["auto", "online", "offline", "disabled"])
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "scheduler_real.json"))
    ap.add_argument("--run-dir", default=str(ROOT / "runs" / "bench_scheduler"))
    ap.add_argument("--smoke", action="store_true", help="2 steps, 2-3 domains, dev seed")
    a = ap.parse_args(argv)
    if a.smoke:
        a.seeds, a.steps, a.prompts, a.eval_every, a.eval_n = "dev", 2, 2, 1, 4
        a.domains = ["tiny/letter_counting", "tinymix/add", "tinymix/add_last_digit"]
    return a


PAIR = ("tinymix/add", "tinymix/add_last_digit")  # the constructed conflicting pair


def draw_seesaw(results: dict[str, Any], path: Path) -> list[Path]:
    """The seesaw picture: the ``adaptive`` run of the first seed whose guard flagged a domain of
    the constructed pair (else any domain), that domain's curve with the events, its share of
    the mix and its temperature; the same seed without the guard dashed (identical until the
    guard first acts), the partner dotted. Nothing is drawn if the guard never fired."""
    from megatron_rl.scheduler.curves import seesaw_png

    runs = results.get("adaptive", {})
    flagged = [
        (seed, e["domain"])
        for seed, r in runs.items()
        for e in r["seesaw_events"]
        if e["event"] == "regression"
    ]
    picks = [f for f in flagged if f[1] in PAIR] or flagged
    if not picks:
        print("the adaptive runs raised no regression event: no seesaw picture")
        return []
    seed, domain = picks[0]
    other = results.get("adaptive, no seesaw guard", {}).get(seed)
    partner = next((d for d in PAIR if d != domain), None) if domain in PAIR else None
    compare = (other["run_dir"],) if other else ()
    return [seesaw_png(runs[seed]["run_dir"], domain, path, compare, partner)]


def settings(name: str, a: argparse.Namespace) -> tuple[Arms, argparse.Namespace]:
    """An experiment's arms, and the arguments with its domains and eval size filled in."""
    arms, domains, eval_n = EXPERIMENTS[name]
    e = argparse.Namespace(**vars(a))
    e.domains = a.domains if name == "mix" and a.domains else domains
    e.eval_n = a.eval_n or eval_n
    return arms, e


def run_experiment(name: str, a: argparse.Namespace, run_dir: Path) -> dict[str, Any]:
    """Every arm x seed of one experiment; its section of the JSON."""
    arms, e = settings(name, a)
    seeds = REPORT_SEEDS if a.seeds == "report" else DEV_SEEDS
    planned = planned_groups(e, run_dir, arms)
    t0 = time.time()
    results = run_all(e, seeds, run_dir, arms)
    print(f"== {name}: {len(arms)} arms x seeds {list(seeds)}, {e.steps} steps")
    print(table(results))
    if name == "temperature":
        print(temperature_table(results))
    return {
        "seeds": a.seeds,
        "seed_values": list(seeds),
        "report_seeds": list(REPORT_SEEDS),
        "dev_seeds": list(DEV_SEEDS),
        "steps": e.steps,
        "prompts_per_step": e.prompts,
        "eval_tasks_per_domain": e.eval_n,
        "generated_groups_per_step": planned,
        "domains": e.domains,
        "arms": arms,
        "wall_s_total": round(time.time() - t0, 1),
        "results": results,
    }


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    out, run_dir = Path(a.out), Path(a.run_dir)
    names = list(EXPERIMENTS) if a.experiment == "all" else [a.experiment]
    for name in names:
        doc = run_experiment(name, a, run_dir)
        prev = json.loads(out.read_text()) if out.is_file() else {}
        # the mix experiment at the top (report / dev), others in their own section; report and
        # dev results live side by side, never mixed; written after each experiment
        section = prev if name == "mix" else prev.setdefault(name, {})
        section[a.seeds] = doc
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(prev, indent=1))
        prefix = out.with_suffix("")
        if name == "mix":
            pngs = draw(doc["results"], prefix)
            seesaw = ROOT / "docs" / "scheduler_seesaw.png" if a.seeds == "report" else None
            pngs += draw_seesaw(doc["results"], seesaw or Path(f"{prefix}_seesaw.png"))
        else:
            pngs = [draw_temperature(doc["results"], Path(f"{prefix}_{name}.png"))]
        log_wandb(a.wandb, run_dir, name, doc, doc["results"], pngs)
        print(f"wrote {out} ({name}) and {', '.join(str(p) for p in pngs)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
