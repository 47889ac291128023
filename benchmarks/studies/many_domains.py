"""The many-domain study (issue 40): one GRPO run over ~300 domains, arms at equal generation.

Registered in docs/scheduler.md ("Hundreds of domains") before any report run. Every run is
``configs/many_domains_cpu.yaml`` (the demo's tiny base, 32 generated groups of 8 per step, the
groups with reward variance trained, no refill and no zero-variance fill) with one arm's
scheduler overrides, a seed and the study's length. Each finished run's extract (per-sweep
per-domain held-out results, per-step generated / trained / with-signal group counts, the
guard's events, timings) is stored in ``many_domains.json.gz`` as soon as it finishes, so a part
can stop and resume; a stored run is reused only under the same settings and arm config.
``many_stats.py`` recomputes every statistic from the stored runs.

Parts (``--part``): ``dev`` (the baseline and the static candidates on the development seeds),
``dev-learned`` (the candidate built from the dev baseline runs), ``headroom`` (the baseline and
the oracle, chosen on the dev seeds, on the report seeds). ``--quick`` runs a small version into
a scratch file (``make test``: two arms, one seed, four steps, eight domains; no timing).

    .venv/bin/python -m benchmarks.studies.many_domains --part dev
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks.harness import OUT, ROOT, rel
from benchmarks.studies.many_screen import CONFIG, SCREEN, load_screen
from benchmarks.studies.many_stats import BASELINE, compute, read
from benchmarks.studies.scheduler_runs import even, write

DOC = Path(__file__).with_name("many_domains.json.gz")
DEV_SEEDS = (1, 2)  # development: the oracle and the adaptive options are chosen here
REPORT_SEEDS = (41, 42, 43, 44, 45, 46, 47, 48)  # fixed 2026-12-05 before any run; never tuned on
STEPS, EVAL_EVERY, GROUP, PER_STEP = 600, 150, 8, 32
QUICK_DOMAINS = [
    "ladder/chain_sum_t2_d1to2",
    "ladder/letter_counting_words3",
    "ladder/gcd_max50",
    "ladder/spell_backward_len5",
    "ladder/count_bits_bits10",
    "ladder/number_format_c2_max99_d5",
    "ladder/lcm_max1000",
    "rg/gcd@0",
]
Arms = dict[str, list[str]]


def static_arm(domains: list[str]) -> list[str]:
    return ["scheduler.policy=static", f"scheduler.weights={json.dumps(even(sorted(domains)))}"]


def candidates(screen: dict[str, Any], doc: dict[str, Any]) -> Arms:
    """The static mixes the oracle is chosen from (on the development seeds)."""
    classes = {d: r["class"] for d, r in screen["domains"].items()}
    out = {
        "static: frontier": static_arm([d for d, c in classes.items() if c == "frontier"]),
        "static: primary": static_arm(screen["primary"]),
    }
    base = doc.get("sections", {}).get("dev", {}).get("runs", {}).get(BASELINE, {})
    if base:  # the domains whose held-out accuracy rose in the dev baseline runs, on average
        gain: dict[str, list[float]] = {}
        for run in base.values():
            first, last = run["sweeps"][0]["acc"], run["sweeps"][-1]["acc"]
            for d in last:
                gain.setdefault(d, []).append(last[d] - first.get(d, 0.0))
        rose = [d for d, g in gain.items() if sum(g) / len(g) > 0]
        out["static: rose on dev"] = static_arm(rose)
    return out


def oracle(doc: dict[str, Any], screen: dict[str, Any]) -> tuple[str, list[str]]:
    """The candidate with the best mean dev primary score (raises before the dev part ran)."""
    stats = compute(doc, screen).get("dev", {}).get("arms", {})
    cands = candidates(screen, doc)
    scored = {a: stats[a]["primary"] for a in cands if a in stats}
    if len(scored) < len(cands):
        raise SystemExit(f"the oracle needs the dev runs of {sorted(set(cands) - set(scored))}")
    best = max(scored, key=lambda a: scored[a])
    return best, cands[best]


def part_arms(part: str, doc: dict[str, Any], screen: dict[str, Any]) -> tuple[Arms, tuple]:
    cands = candidates(screen, doc)
    if part == "dev":
        arms = {BASELINE: [], **{k: v for k, v in cands.items() if "dev" not in k}}
        return arms, DEV_SEEDS
    if part == "dev-learned":
        if "static: rose on dev" not in cands:
            raise SystemExit("--part dev-learned needs the dev baseline runs (run --part dev)")
        return {"static: rose on dev": cands["static: rose on dev"]}, DEV_SEEDS
    if part == "headroom":
        name, cfg = oracle(doc, screen)
        print(f"oracle (best on the dev seeds): {name}", flush=True)
        return {BASELINE: [], f"oracle ({name})": cfg}, REPORT_SEEDS
    raise SystemExit(f"--part {part!r}: choose dev, dev-learned or headroom")


def overrides(arm: list[str], name: str, seed: int, a: argparse.Namespace) -> list[str]:
    out = [
        f"output_dir={a.run_dir}",
        f"run_name={name}",
        f"seed={seed}",
        f"train.steps={a.steps}",
        f"eval.every={a.eval_every}",
        "checkpoint.every=0",
        f"tracking.wandb={a.wandb}",
        "tracking.progress=false",
    ]
    if a.quick:
        out += [f"domains.include={json.dumps(QUICK_DOMAINS)}", "eval.samples_per_domain=8"]
    return out + arm


def run_one(arm: list[str], name: str, seed: int, a: argparse.Namespace) -> Path:
    out = Path(a.run_dir) / name
    shutil.rmtree(out, ignore_errors=True)  # a fresh run (the CLI would resume an old one)
    out.mkdir(parents=True)
    cmd = [sys.executable, "-m", "launch.cli", "train", str(CONFIG), *overrides(arm, name, seed, a)]
    with (out / "bench_stdout.txt").open("w") as log:
        rc = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        tail = (out / "bench_stdout.txt").read_text()[-2000:]
        raise RuntimeError(f"{name} failed (rc {rc}):\n{tail}")
    return out


def extract(run: Path) -> dict[str, Any]:
    """What the statistics need of one run, from its metrics.jsonl and events.jsonl."""
    from megatron_rl.scheduler.curves import read_jsonl

    rows = read_jsonl(run / "metrics.jsonl")
    steps = [r for r in rows if "rollout/groups_generated" in r]
    by_step: dict[int, dict[str, Any]] = {}  # a sweep's row is logged twice (sweep, step end)
    for r in rows:
        if "eval/mean_accuracy" in r:
            by_step.setdefault(int(r["step"]), {}).update(r)
    sweeps = []
    for i, (at, r) in enumerate(sorted(by_step.items())):
        # the sweep before training is at 0; a periodic one follows step `at` (0-based), so
        # at + 1 steps are done; the final one is logged at the step count itself
        done = 0 if i == 0 else min(at + 1, len(steps))
        names = [k[5:-9] for k in r if k.startswith("eval/") and k.endswith("/accuracy")]
        names = [n for n in names if n != "mean" and "/level" not in n]
        acc = {n: round(r[f"eval/{n}/accuracy"], 6) for n in sorted(names)}
        se = {n: round(r.get(f"eval/{n}/stderr", 0.0), 6) for n in sorted(names)}
        sweeps.append({"step": done, "acc": acc, "se": se})
    events = [
        e for e in read_jsonl(run / "events.jsonl") if e.get("event") in ("regression", "recovery")
    ]
    time_of = {
        k: round(sum(r.get(f"time/{k}_s", 0.0) for r in rows), 1)
        for k in ("generate", "train", "eval", "step")
    }
    return {
        "sweeps": sweeps,
        "generated": [int(r["rollout/groups_generated"]) for r in steps],
        "trained": [int(r["rollout/groups_trained"]) for r in steps],
        "signal": [int(r["rollout/groups_trained_with_signal"]) for r in steps],
        "events": [{k: e[k] for k in ("step", "event", "domain") if k in e} for e in events],
        "seconds": {
            **time_of,
            "wall": round(json.loads((run / "summary.json").read_text()).get("wall_s", 0.0), 1),
        },
    }


def check_budget(name: str, ex: dict[str, Any], filtered: bool) -> None:
    """Every step generated PER_STEP groups; a filtering arm trained exactly its groups with
    signal (no zero-variance fill), a plain one every group it generated."""
    gen, tr, sig = ex["generated"], ex["trained"], ex["signal"]
    if set(gen) != {PER_STEP}:
        raise RuntimeError(f"{name}: generated {sorted(set(gen))} groups per step, not {PER_STEP}")
    if filtered and tr != sig:
        raise RuntimeError(f"{name}: trained groups without signal (trained {tr}, signal {sig})")
    if not filtered and tr != gen:
        raise RuntimeError(f"{name}: trained {sorted(set(tr))} of {PER_STEP} groups")


def settings(a: argparse.Namespace) -> dict[str, Any]:
    return {
        "steps": a.steps,
        "eval_every": a.eval_every,
        "group": GROUP,
        "per_step": PER_STEP,
        "config": rel(str(CONFIG)),
        "quick": a.quick,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", default="dev")
    ap.add_argument("--quick", action="store_true", help="small and fast, into a scratch file")
    ap.add_argument("--seeds", type=int, nargs="*", help="only these of the part's seeds")
    ap.add_argument("--jobs", type=int, default=2, help="runs at once (one torch thread each)")
    ap.add_argument("--json", default=None, help=f"default: {rel(str(DOC))} (quick: scratch)")
    ap.add_argument("--run-dir", default=str(OUT / "many_domains"))
    ap.add_argument("--wandb", default="disabled")
    a = ap.parse_args(argv)
    a.steps, a.eval_every = (4, 2) if a.quick else (STEPS, EVAL_EVERY)
    path = Path(a.json or (OUT / "many_domains_quick.json.gz" if a.quick else DOC))
    doc = read(path) if path.is_file() else {"sections": {}}
    screen = load_screen(SCREEN)
    arms, seeds = part_arms(a.part, doc, screen)
    if a.quick:
        arms, seeds = {BASELINE: [], "uniform": ["scheduler.filter_zero_variance=false"]}, (1,)
    seeds = tuple(s for s in seeds if not a.seeds or s in a.seeds)
    name = "dev" if a.part.startswith("dev") else a.part
    sec = doc["sections"].setdefault(name, {"settings": settings(a), "runs": {}, "arms": {}})
    if sec["settings"] != settings(a):
        raise SystemExit(f"section {name!r} was run with {sec['settings']}; not {settings(a)}")
    for arm, cfg in arms.items():  # a changed arm config reruns that arm
        if sec["arms"].get(arm, cfg) != cfg:
            sec["runs"].pop(arm, None)
        sec["arms"][arm] = cfg
    jobs = [(arm, s) for s in seeds for arm in arms if str(s) not in sec["runs"].get(arm, {})]
    print(f"part {a.part}: {len(jobs)} runs to do ({len(arms)} arms x seeds {list(seeds)})")
    lock, failed, t0 = threading.Lock(), [], time.time()

    def attempt(job: tuple[str, int]) -> None:
        arm, s = job
        slug = re.sub(r"[^0-9a-zA-Z]+", "_", arm).strip("_")
        try:
            ex = extract(run_one(arms[arm], f"{slug}-s{s}", s, a))
            check_budget(f"{arm} seed {s}", ex, "filter_zero_variance=false" not in str(arms[arm]))
        except RuntimeError as e:
            print(e, file=sys.stderr, flush=True)
            failed.append(f"{arm} seed {s}")
            return
        with lock:
            sec["runs"].setdefault(arm, {})[str(s)] = ex
            doc["stats"] = json.loads(json.dumps(compute(doc, screen)))
            write(path, doc)
            print(f"{arm} seed {s}: done, {time.time() - t0:.0f} s into the part", flush=True)

    with ThreadPoolExecutor(max_workers=a.jobs) as pool:
        list(pool.map(attempt, jobs))
    if failed:
        raise SystemExit(f"{len(failed)} of {len(jobs)} runs failed: {failed}")
    doc["stats"] = json.loads(json.dumps(compute(doc, screen)))
    write(path, doc)
    from benchmarks.studies.many_report import report

    print(report(doc, screen, name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
