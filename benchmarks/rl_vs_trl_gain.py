"""Time to +10 held-out points, megatron-rl against TRL's ``GRPOTrainer``, over paired seeds.

The tiny model at the demo's scale (its base, prompts per step, steps, LR and cosine schedule;
``rl_vs_trl.py`` has the like-for-like settings and the differences that remain). Per seed:

- **like for like**: megatron-rl (synchronous, uniform, no filter, no KL) and TRL at once, one
  torch thread each on the two cores;
- **the demo recipe** (``configs/demo_cpu.yaml`` as shipped: zero-variance filter with refill
  from 2x over-sampling, one-step off-policy generation in the engine's own process), alone on
  the machine afterwards. Not like for like: it generates twice the groups and uses both cores.

Every run sweeps the same held-out prompts (128 per domain, 512 in all: one sweep's SE is about
0.02) at the start and every 10 steps. Time to +10 is the training time (step times, sweeps left
out) at the first sweep whose mean reaches the seed's start + 0.10; a run stops counting after
``cap_s`` seconds of training (TRL's run stops there; a tool that does not get there makes the
ratio a bound). The ratio's summary is the median over seeds, with a 95% t interval of the
geometric mean (log ratios). Each run also keeps its per-step training reward and grad norm.

Runs are stored seed by seed in ``benchmarks/rl_vs_trl_gain.json`` and reused: a seed already
there under the same settings is not run again, so the study can be run in parts.

    .venv/bin/python -m benchmarks.rl_vs_trl_gain [--seeds 1 2 3 4 5] [--quick] [--json out.json]
    .venv/bin/python -m benchmarks.rl_vs_trl_gain --check   # recompute every statistic
    .venv/bin/python -m benchmarks.rl_vs_trl_gain --plot    # docs/rl_vs_trl.png
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from itertools import accumulate
from pathlib import Path
from typing import Any

from benchmarks.harness import OUT, ROOT
from benchmarks.harness import train as harness_train
from benchmarks.rl_vs_trl import CONFIG, DEMO, DIFFERENCES, SIZES, read_run, run_megatron, run_trl
from benchmarks.studies import stored_runs
from benchmarks.studies.scheduler_stats import paired

STORE = ROOT / "benchmarks" / "rl_vs_trl_gain.json"
GAIN = 0.10  # the target: the seed's held-out start + 0.10
ARMS = ("megatron_rl", "trl", "demo_recipe")
SETTINGS: dict[str, Any] = {  # what every stored run shares (a change is refused, not mixed)
    "model": SIZES["tiny"]["model"],
    "steps": int(DEMO["train"]["steps"]),
    "prompts": int(DEMO["rl"]["prompts_per_step"]),
    "group": int(DEMO["rl"]["group_size"]),
    "max_tokens": int(DEMO["rollout"]["max_new_tokens"]),
    "lr": float(DEMO["train"]["lr"]),
    "min_lr": float(DEMO["train"]["min_lr"]),
    "threads": 1,
    "eval_every": 10,
    "eval_n": 128,
    "cap_s": 900.0,
}
QUICK = dict(SETTINGS, steps=4, prompts=4, eval_every=2, eval_n=4, cap_s=60.0)


def demo_overrides(spec: dict[str, Any]) -> list[str]:
    """The demo as shipped, with the study's sweeps and no checkpoints or W&B."""
    return [
        f"output_dir={spec['out']}", "run_name=mrl", f"seed={spec['seed']}",
        f"train.steps={spec['steps']}", f"rl.prompts_per_step={spec['prompts']}",
        f"eval.every={spec['eval_every']}", f"eval.samples_per_domain={spec['eval_n']}",
        "eval.train_prompts=0", "checkpoint.every=0", "tracking.wandb=disabled",
        "tracking.progress=false",
    ]  # fmt: skip


def extract(run: dict[str, Any]) -> dict[str, Any]:
    """What the study keeps of a run: per-step seconds, sweeps, traces, its start."""
    return {
        "step_s": [s["step"] - s.get("eval", 0.0) for s in run["steps"]],
        "evals": run["evals"],
        "start": run.get("mean_before"),
        "reward": run["reward"],
        "grad_norm": run["grad_norm"],
    }


def spec_for(seed: int, settings: dict[str, Any], out: Path) -> dict[str, Any]:
    spec = dict(settings, seed=seed, level=0, timeout=4 * 3600.0, gain=GAIN)
    spec["model"] = str(ROOT / settings["model"])
    return dict(spec, out=str(out))


def run_pair(seed: int, settings: dict[str, Any], out: Path) -> dict[str, dict[str, Any]]:
    """megatron-rl and TRL like for like, at once (one thread each)."""
    spec = spec_for(seed, settings, out)
    with ThreadPoolExecutor(2) as pool:
        mrl = pool.submit(run_megatron, dict(spec, out=str(out / "mrl")))
        trl = pool.submit(run_trl, dict(spec, out=str(out / "trl"))).result()
        m = mrl.result()
    return {"megatron_rl": extract(m), "trl": extract(trl)}


def run_demo(seed: int, settings: dict[str, Any], out: Path) -> dict[str, Any]:
    """The demo's recipe as users run it, alone on the machine."""
    spec = spec_for(seed, settings, out / "demo")
    harness_train(CONFIG, demo_overrides(spec), timeout=spec["timeout"])
    return extract(read_run(out / "demo" / "mrl"))


# ---- statistics (pure functions of the stored runs) ----


def reach(run: dict[str, Any], target: float, cap_s: float) -> dict[str, Any]:
    """Steps and training seconds at the first sweep within ``cap_s`` whose mean reaches
    ``target``; else the steps and seconds the run had within the cap."""
    ends = list(accumulate(run["step_s"]))
    n_cap = next((i + 1 for i, t in enumerate(ends) if t >= cap_s), len(ends))
    for e in run["evals"]:
        if e["step"] <= n_cap and e["mean"] >= target - 1e-9:
            return {"reached": True, "steps": e["step"], "seconds": e["train_s"]}
    return {"reached": False, "steps": n_cap, "seconds": ends[n_cap - 1] if n_cap else 0.0}


def ratio(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """a / b time to the target: equal when both got there, else a bound (the one that did not
    get there stands in with all its time), none when neither did."""
    bound = {(True, True): "=", (True, False): "<=", (False, True): ">="}.get(
        (a["reached"], b["reached"]), "neither reached"
    )
    value = a["seconds"] / b["seconds"] if bound != "neither reached" else None
    return {"ratio": value, "bound": bound}


def summary(ratios: list[dict[str, Any]]) -> dict[str, Any]:
    """Median of the per-seed ratios and the 95% t interval of their geometric mean; bounds are
    counted in with their value and named (an upper bound makes the interval conservative)."""
    vals = [r["ratio"] for r in ratios if r["ratio"] is not None]
    out: dict[str, Any] = {"n": len(vals), "seeds_not_equal": [r["bound"] for r in ratios
                                                               if r["bound"] != "="]}  # fmt: skip
    if not vals:
        return out
    out["median"] = statistics.median(vals)
    logs = paired([math.log(v) for v in vals])  # mean, SE and t interval of the log ratios
    out["geomean"] = math.exp(logs["mean"])
    if "ci95" in logs:
        out["ci95"] = [math.exp(x) for x in logs["ci95"]]
    return out


def per_step_gap(a: dict[str, Any], b: dict[str, Any]) -> float | None:
    """Mean over the sweeps both runs made at the same step of a's held-out mean minus b's: how
    far apart the two curves are per step, whatever the time a step costs."""
    at_b = {e["step"]: e["mean"] for e in b["evals"]}
    gaps = [e["mean"] - at_b[e["step"]] for e in a["evals"] if e["step"] in at_b]
    return sum(gaps) / len(gaps) if gaps else None


def gaps(values: list[float | None]) -> dict[str, Any]:
    """Paired per-seed gaps: mean, SE, 95% t interval (n = 0 when none)."""
    got = [v for v in values if v is not None]
    return paired(got) if got else {"n": 0}


def step_ratio(row: dict[str, Any]) -> dict[str, Any]:
    """Mean step time (the first left out) megatron-rl / TRL, both running at once."""
    return {"ratio": row["megatron_rl"]["step_s_mean"] / row["trl"]["step_s_mean"], "bound": "="}


def compute(doc: dict[str, Any]) -> dict[str, Any]:
    """Every statistic of the study from its stored runs."""
    sec = doc["sections"].get("gain")
    if not sec:
        return {}
    cap = float(sec["settings"]["cap_s"])
    runs = sec["runs"]
    both = set(runs.get("megatron_rl", {})) & set(runs.get("trl", {}))
    seeds = sorted(int(s) for s in both)
    per_seed: dict[str, Any] = {}
    for s in seeds:
        k = str(s)
        start = float(runs["megatron_rl"][k]["start"])
        row: dict[str, Any] = {"start": start, "target": start + GAIN}
        for arm in ARMS:
            if k in runs.get(arm, {}):
                run = runs[arm][k]
                row[arm] = reach(run, start + GAIN, cap)
                row[arm]["step_s_mean"] = sum(run["step_s"][1:]) / max(len(run["step_s"]) - 1, 1)
        row["ratio"] = ratio(row["megatron_rl"], row["trl"])
        row["per_step_gap"] = per_step_gap(runs["megatron_rl"][k], runs["trl"][k])
        if "demo_recipe" in row:
            row["demo_ratio"] = ratio(row["demo_recipe"], row["trl"])
            row["demo_per_step_gap"] = per_step_gap(runs["demo_recipe"][k], runs["trl"][k])
        per_seed[k] = row
    rows = list(per_seed.values())
    return {
        "per_seed": per_seed,
        "like_for_like": summary([r["ratio"] for r in rows]),
        "demo_recipe": summary([r["demo_ratio"] for r in rows if "demo_ratio" in r]),
        "step_time_ratio": summary([step_ratio(r) for r in rows]),
        "per_step_gap": gaps([r["per_step_gap"] for r in rows]),
        "demo_per_step_gap": gaps([r.get("demo_per_step_gap") for r in rows]),
    }


# ---- printing, picture, running ----


def _fmt(s: dict[str, Any]) -> str:
    if "median" not in s:
        return "no seed yet"
    ci = s.get("ci95")
    ci_text = f", geometric mean {s['geomean']:.3f} (95% CI {ci[0]:.3f}..{ci[1]:.3f})" if ci else ""
    bounds = f"; bounds: {', '.join(s['seeds_not_equal'])}" if s["seeds_not_equal"] else ""
    return f"median {s['median']:.3f} over {s['n']} seeds{ci_text}{bounds}"


def report(st: dict[str, Any]) -> str:
    lines = [f"{'seed':>4} {'start':>6}  {'megatron-rl':>17}  {'TRL':>17}  {'ratio':>8}  "
             f"{'demo recipe':>17}  {'ratio':>8}"]  # fmt: skip

    def cell(r: dict[str, Any] | None) -> str:
        if r is None:
            return f"{'-':>17}"
        mark = "" if r["reached"] else " not"
        return f"{r['steps']:>4} st {r['seconds']:>6.0f} s{mark:>4}"

    def rt(r: dict[str, Any] | None) -> str:
        if r is None or r["ratio"] is None:
            return f"{'-':>8}"
        return f"{('' if r['bound'] == '=' else r['bound']) + format(r['ratio'], '.3f'):>8}"

    for k, row in st.get("per_seed", {}).items():
        lines.append(f"{k:>4} {row['start']:>6.3f}  {cell(row['megatron_rl'])}  "
                     f"{cell(row['trl'])}  {rt(row['ratio'])}  {cell(row.get('demo_recipe'))}  "
                     f"{rt(row.get('demo_ratio'))}")  # fmt: skip
    lines.append(f"time to +10, megatron-rl / TRL like for like: {_fmt(st['like_for_like'])}")
    lines.append(f"time to +10, demo recipe / TRL (not like for like): {_fmt(st['demo_recipe'])}")
    lines.append(f"step time, megatron-rl / TRL (both at once): {_fmt(st['step_time_ratio'])}")
    for key, name in (("per_step_gap", "megatron-rl"), ("demo_per_step_gap", "demo recipe")):
        g = st.get(key, {})
        if g.get("n"):
            se = f" (SE {g['se']:.4f})" if g["n"] > 1 else ""
            lines.append(
                f"held-out at equal steps, {name} - TRL (mean over shared sweeps): "
                f"{g['mean']:+.4f}{se}, {g['positive']} of {g['n']} seeds above"
            )
    return "\n".join(lines)


def plot(doc: dict[str, Any], path: Path) -> None:
    """Held-out mean against step and against training seconds, and the training reward, every
    seed, each tool in its own colour; the target of each seed dotted."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sec = doc["sections"]["gain"]
    st = doc["stats"]
    colors = {"megatron_rl": "tab:blue", "trl": "tab:orange", "demo_recipe": "tab:green"}
    labels = {"megatron_rl": "megatron-rl", "trl": "TRL", "demo_recipe": "megatron-rl demo recipe"}
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    for arm in ARMS:
        for k, run in sorted(sec["runs"].get(arm, {}).items()):
            first = k == min(sec["runs"][arm], key=int)
            pts = [(0, 0.0, run["start"])] + [(e["step"], e["train_s"], e["mean"])
                                              for e in run["evals"]]  # fmt: skip
            kw = {"color": colors[arm], "alpha": 0.75, "lw": 1.2}
            axes[0].plot([p[0] for p in pts], [p[2] for p in pts], label=labels[arm] if first
                         else None, **kw)  # fmt: skip
            axes[1].plot([p[1] for p in pts], [p[2] for p in pts], **kw)
            rew = run["reward"]
            smooth = [sum(rew[max(0, i - 9):i + 1]) / len(rew[max(0, i - 9):i + 1])
                      for i in range(len(rew))]  # fmt: skip
            axes[2].plot(range(1, len(rew) + 1), smooth, **kw)
    for row in st.get("per_seed", {}).values():
        for ax in axes[:2]:
            ax.axhline(row["target"], color="grey", ls=":", lw=0.8)
    n = sec["settings"]["eval_n"]
    axes[0].set(xlabel="step", ylabel=f"held-out mean accuracy (greedy, {n} prompts per domain)",
                title="held-out against steps")  # fmt: skip
    axes[1].set(xlabel="training seconds (sweeps left out)", title="held-out against time",
                xlim=(0, sec["settings"]["cap_s"]))  # fmt: skip
    axes[2].set(xlabel="step", ylabel="training reward (10-step mean)", title="training reward")
    axes[0].legend(loc="lower right")
    fig.suptitle("time to +10 held-out points: " + _fmt(st["like_for_like"])
                 + "; dotted: each seed's target", fontsize=10)  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_seeds(a: argparse.Namespace, path: Path) -> int:
    settings = QUICK if a.quick else SETTINGS
    doc = stored_runs.read(path) if path.is_file() else {"sections": {}}
    arms = {arm: [json.dumps(settings, sort_keys=True)] for arm in ARMS}
    sec = stored_runs.section(doc, "gain", settings, arms)
    out = Path(a.run_dir)
    t0 = time.time()

    def store(seed: int, runs: dict[str, dict[str, Any]], load: float) -> None:
        """A seed's finished runs (by arm) into the document, written at once with its
        statistics."""
        for arm, run in runs.items():
            sec["runs"].setdefault(arm, {})[str(seed)] = dict(run, load_avg_1m=load)
        doc["stats"] = compute(doc)
        stored_runs.write(path, doc)

    for seed in a.seeds:  # the like-for-like pairs of every seed first, then the demo recipes
        k, load = str(seed), os.getloadavg()[0]
        if all(k in sec["runs"].get(arm, {}) for arm in ("megatron_rl", "trl")):
            continue
        print(f"seed {seed}: megatron-rl and TRL at once (load {load:.1f})", flush=True)
        store(seed, run_pair(seed, settings, out / f"s{seed}"), load)
        print(f"seed {seed}: pair stored, {time.time() - t0:.0f} s into the part", flush=True)
    for seed in [] if a.like_for_like_only else a.seeds:
        k, load = str(seed), os.getloadavg()[0]
        if k in sec["runs"].get("demo_recipe", {}):
            continue
        print(f"seed {seed}: the demo recipe alone (load {load:.1f})", flush=True)
        store(seed, {"demo_recipe": run_demo(seed, settings, out / f"s{seed}")}, load)
        print(f"seed {seed}: demo recipe stored, {time.time() - t0:.0f} s into the part")
    doc["stats"] = compute(doc)
    stored_runs.write(path, doc)
    print(report(doc["stats"]))
    print("\nDifferences that remain:\n" + "\n".join(f"- {d}" for d in DIFFERENCES))
    if a.json:
        Path(a.json).write_text(json.dumps(results(doc), indent=1))
    return 0


def results(doc: dict[str, Any]) -> dict[str, Any]:
    """What ``make bench`` keeps (results.json): every statistic and each run's traces."""
    sec = doc["sections"]["gain"]
    runs = {arm: {k: {"reward": r["reward"], "grad_norm": r["grad_norm"], "evals": r["evals"]}
                  for k, r in sec["runs"].get(arm, {}).items()} for arm in ARMS}  # fmt: skip
    return {"time_to_10": doc["stats"], "settings": sec["settings"], "runs": runs}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    p.add_argument("--quick", action="store_true", help="tiny settings, into a scratch file")
    p.add_argument("--store", default=None, help=f"the stored runs (default {STORE.name})")
    p.add_argument("--run-dir", default=None, help="runs' directories (default under out/)")
    p.add_argument("--like-for-like-only", action="store_true", help="leave the demo recipe")
    p.add_argument("--json", default=None, help="write the statistics and traces here")
    p.add_argument("--threads", type=int, default=1, help="accepted for make bench; always 1")
    p.add_argument("--check", action="store_true", help="recompute every statistic and compare")
    p.add_argument("--write", action="store_true", help="store the recomputed statistics")
    p.add_argument("--plot", default=None, nargs="?", const=str(ROOT / "docs" / "rl_vs_trl.png"))
    a = p.parse_args(argv)
    path = Path(a.store) if a.store else (OUT / "rl_vs_trl_gain.quick.json" if a.quick else STORE)
    if a.check or a.write:
        doc = stored_runs.read(path)
        return stored_runs.recheck(path, doc, json.loads(json.dumps(compute(doc))), a.write)
    if a.plot:
        plot(stored_runs.read(path), Path(a.plot))
        print(f"wrote {a.plot}")
        return 0
    a.run_dir = a.run_dir or str(OUT / ("rl_vs_trl_gain_quick" if a.quick else "rl_vs_trl_gain"))
    with stored_runs.exclusive(path):
        return run_seeds(a, path)


if __name__ == "__main__":
    raise SystemExit(main())
