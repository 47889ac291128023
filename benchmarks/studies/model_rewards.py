"""The model-reward study (issue 38): a learned reward against the rule, hacking caught, and
safety as a constraint, over paired seeds.

Part ``rm`` trains ``configs/reward_model_cpu.yaml`` (the demo's base on its two spelling
domains) three ways from the same base on the same seeds: rewarded by the rule verifier
(``rule``), by the learned ``models/tiny-rm`` (``reward model``) and by the exploitable
``models/tiny-rm-hackable`` (``hackable reward model``, which overrates long and repeated
answers). Held-out accuracy is always the verifier's. Part ``constraint`` trains
``configs/constraint_cpu.yaml`` (the constructed pair ``tinycon/spell_e_words`` /
``tinycon/spell_clean_words``: an answer with an "e" is a hard violation) with the violation
priced by a Lagrange multiplier (``lagrangian``: plain dual ascent, budget ``BUDGET``;
``lagrangian, PI``: with a proportional term, ``rewards.constraint_kp``), with the domains'
floor alone (``floor -1``) and with a floor of 0 (``floor 0``, a violation zeroes the reward);
the floor arms log the violation rate through a multiplier capped at 0.

Every run sweeps held-out accuracy every ``EVAL_EVERY`` steps. Each finished run's extract is
stored in ``model_rewards.json.gz`` as soon as it finishes (a part can stop and resume; a stored
run is reused only under the same settings and arm config); ``model_rewards_stats.py``
recomputes every statistic. Seed 0 was the development seed (the pilots that set the step count
and the budget; seeds 0 and 100 for the PI arm's gain); the report seeds are ``SEEDS``, and
``CONSTRAINT_SEEDS`` for the constraint part.

    .venv/bin/python -m benchmarks.studies.model_rewards --part rm
    .venv/bin/python -m benchmarks.studies.model_rewards --part constraint
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from benchmarks.harness import OUT, rel
from benchmarks.studies import stored_runs
from benchmarks.studies.model_rewards_stats import CONSTRAINT, compute, report
from benchmarks.studies.stored_runs import read

DOC = Path(__file__).with_name("model_rewards.json.gz")
SEEDS = (1, 2, 3, 4)  # report seeds, fixed before any report run (0: the pilots)
# the constraint part's second four, fixed (before any run on them) when the PI arm was added
# after plain dual ascent ended over budget on seed 4 (docs/rewards.md)
CONSTRAINT_SEEDS = (*SEEDS, 5, 6, 7, 8)
# the rm part's runs were redone with the monitor's second divergence rule (the first missed
# three of the four collapses on seeds 1-2, the only ones seen); seeds 5-6 added then
RM_SEEDS = (*SEEDS, 5, 6)
EVAL_EVERY = 10
BUDGET = 0.05
PARTS: dict[str, dict[str, Any]] = {
    "rm": {
        "config": "configs/reward_model_cpu.yaml",
        "steps": 100,
        "seeds": RM_SEEDS,
        "arms": {
            "rule": ['rewards.reward_model.model=""'],
            "reward model": [],
            "hackable reward model": ["rewards.reward_model.model=models/tiny-rm-hackable"],
        },
    },
    "constraint": {
        "config": "configs/constraint_cpu.yaml",
        "steps": 150,
        "seeds": CONSTRAINT_SEEDS,
        "arms": {
            "lagrangian": ["rewards.violation_floor=false"],
            "lagrangian, PI": ["rewards.violation_floor=false", "rewards.constraint_kp=10"],
            "floor -1": ["rewards.violation_floor=true", "rewards.constraint_max=0"],
            "floor 0": [
                "rewards.violation_floor=true",
                "rewards.violation_floor_value=0",
                "rewards.constraint_max=0",
            ],
        },
    },
}
# per-step keys kept in a run's trace (a missing key is NaN at that step)
TRACE_KEYS = ("rollout/reward_mean", "rollout/groups_trained")
TRACE_SUFFIXES = ("/reward_mean", "/verified_mean", "/accuracy", "/rate", "/multiplier")


def settings(part: str, quick: bool) -> dict[str, Any]:
    p = PARTS[part]
    steps = 4 if quick else p["steps"]
    out = {"config": p["config"], "steps": steps, "eval_every": 2 if quick else EVAL_EVERY}
    return out | ({"budget": BUDGET} if part == "constraint" else {}) | {"quick": quick}


def run_one(part: str, arm: list[str], name: str, seed: int, a: argparse.Namespace) -> Path:
    s = settings(part, a.quick)
    args = [f"seed={seed}", f"train.steps={s['steps']}", f"eval.every={s['eval_every']}"]
    args += ["checkpoint.every=0", f"tracking.wandb={a.wandb}", "tracking.progress=false"]
    if part == "constraint":
        args.append(f'rewards.constraints={{"{CONSTRAINT}": {BUDGET}}}')
    if a.quick:
        args += ["eval.samples_per_domain=8", "rl.prompts_per_step=4"]
    return stored_runs.train(s["config"], args + arm, a.run_dir, name)


def traced(key: str) -> bool:
    """Whether a per-step metric goes into a run's stored trace."""
    if key in TRACE_KEYS:
        return True
    if key.startswith(("monitor/", "constraint/")):
        return key.endswith(TRACE_SUFFIXES)
    return key.startswith("rollout/") and key.endswith("/accuracy")


def extract(run: Path) -> dict[str, Any]:
    """Sweeps, the per-step trace and the reward-hacking warnings of one run."""
    from megatron_rl.scheduler.curves import read_jsonl

    rows = read_jsonl(run / "metrics.jsonl")
    steps = [r for r in rows if "rollout/groups_generated" in r]
    sweeps = stored_runs.sweeps(rows)
    keys = sorted({k for r in steps for k in r if traced(k)})
    trace = {k: [round(float(r.get(k, float("nan"))), 6) for r in steps] for k in keys}
    warnings = [
        {"step": e["step"], "warning": e.get("warning"), "domain": e.get("domain")}
        for e in read_jsonl(run / "events.jsonl")
        if e.get("event") == "reward_hacking_warning"
    ]
    wall = json.loads((run / "summary.json").read_text()).get("wall_s", 0.0)
    return {"sweeps": sweeps, "trace": trace, "warnings": warnings, "wall_s": round(wall, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=sorted(PARTS), required=True)
    ap.add_argument("--quick", action="store_true", help="small and fast, into a scratch file")
    ap.add_argument("--seeds", type=int, nargs="*", help=f"default: {list(SEEDS)}")
    ap.add_argument("--jobs", type=int, default=2, help="runs at once (one torch thread each)")
    ap.add_argument("--json", default=None, help=f"default: {rel(str(DOC))} (quick: scratch)")
    ap.add_argument("--run-dir", default=str(OUT / "model_rewards"))
    ap.add_argument("--wandb", default="disabled")
    a = ap.parse_args(argv)
    path = Path(a.json or (OUT / "model_rewards_quick.json.gz" if a.quick else DOC))
    with stored_runs.exclusive(path):  # one runner at a time writes the study's JSON
        return run_part(a, path)


def run_part(a: argparse.Namespace, path: Path) -> int:
    """Run the part's missing runs into ``path`` (under its lock)."""
    doc = read(path) if path.is_file() else {"sections": {}}
    arms: dict[str, list[str]] = PARTS[a.part]["arms"]
    seeds = tuple(a.seeds) if a.seeds else ((1,) if a.quick else PARTS[a.part]["seeds"])
    sec = stored_runs.section(doc, a.part, settings(a.part, a.quick), arms)
    jobs = stored_runs.todo(sec, arms, seeds)
    print(f"part {a.part}: {len(jobs)} runs to do ({len(arms)} arms x seeds {list(seeds)})")

    def attempt(job: stored_runs.Job) -> dict[str, Any]:
        arm, s = job
        return extract(run_one(a.part, arms[arm], f"{a.part}-{stored_runs.slug(arm)}-s{s}", s, a))

    failed = stored_runs.run_jobs(jobs, attempt, sec, doc, path, compute, a.jobs)
    print(report(doc["stats"]))
    if not a.quick:  # the stored study's picture, beside its JSON
        from benchmarks.studies.model_rewards_plot import figure

        print(figure(doc, DOC.with_name("model_rewards.png")))
    if failed:
        raise SystemExit(f"{len(failed)} of {len(jobs)} runs failed: {failed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
