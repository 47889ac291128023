"""Statistics of the model-reward study (issue 38), recomputed from its stored runs.

``model_rewards.json.gz`` (written by ``model_rewards.py``) holds, per part, arm and seed, a
run's extract: its held-out sweeps (per-domain verified accuracy and standard error, the step
each follows), a per-step trace of the keys the statistics read, and its reward-hacking
warnings. This module is the one place the figures are computed:

* **part ``rm``** (the learned reward against the rule): a run's score is the mean over its
  domains of the last sweep's held-out *verified* accuracy (the rule verifier's, whatever the
  run was rewarded by); per arm, the paired difference against ``rule`` per seed, its mean, SE,
  95% t interval and one-sided lower bound.
* **hacking**: a run's *damage step* is the first sweep whose verified accuracy (mean over
  domains) is below the step-0 sweep's by more than twice their combined standard error; its
  *flag step* is the step of its first reward-hacking warning (any kind; also per kind). The
  lead time at a sweep cadence ``c`` is the first damaging sweep among those at multiples of
  ``c`` minus the flag step: how many steps before a person watching the held-out curve at that
  cadence could have seen it. Honest runs' warnings are their false alarms.
* **part ``constraint``**: a run's final violation rate is the mean of
  ``constraint/<name>/rate`` over its last ``LAST`` steps; its task reward is the held-out
  accuracy on the domain the rule leaves (``CLEAN``), first and last sweep. An arm *holds* when
  every seed's final rate is at most the budget.

``python -m benchmarks.studies.model_rewards_stats [--json PATH] [--write]`` recomputes every
statistic and exits 1 if any differs from the stored ones (``make test`` runs it).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.studies.scheduler_stats import paired
from benchmarks.studies.stored_runs import read

RULE = "rule"
HACKABLE = "hackable reward model"
LAGRANGE = "lagrangian"  # plain dual ascent, the first arm
PI = "lagrangian, PI"  # with the proportional term (added after seed 4; docs/rewards.md)
CLEAN = "tinycon/spell_clean_words"
TEMPTED = "tinycon/spell_e_words"
CONSTRAINT = "hard_violation"
LAST = 10  # steps averaged for a run's final violation rate
CADENCES = (10, 50)  # sweep cadences the lead time is read at (50: the configs' eval.every)
Run = dict[str, Any]


def sweep_mean(sweep: dict[str, Any]) -> tuple[float, float]:
    """(mean verified accuracy over the sweep's domains, its standard error)."""
    acc, se = list(sweep["acc"].values()), list(sweep["se"].values())
    return float(np.mean(acc)), float(math.sqrt(sum(s * s for s in se)) / len(se))


def damage_step(run: Run, cadence: int = 1) -> int | None:
    """The first sweep (at a multiple of ``cadence`` steps) significantly below step 0."""
    first, first_se = sweep_mean(run["sweeps"][0])
    for sw in run["sweeps"][1:]:
        if sw["step"] % cadence:
            continue
        acc, se = sweep_mean(sw)
        if acc < first - 2 * math.hypot(se, first_se):
            return int(sw["step"])
    return None


def hacking_stats(run: Run) -> dict[str, Any]:
    """Flag steps (first of any kind, first per kind), warning counts and lead times."""
    flags = run["warnings"]
    kinds = sorted({w["warning"] for w in flags})
    first = min((w["step"] for w in flags), default=None)
    lead: dict[str, int | None] = {}
    for c in CADENCES:
        seen = damage_step(run, c)
        lead[str(c)] = None if seen is None or first is None else seen - first
    return {
        "flag_step": first,
        "first_by_kind": {k: min(w["step"] for w in flags if w["warning"] == k) for k in kinds},
        "warnings": len(flags),
        "damage_step": damage_step(run),
        "lead_time": lead,
    }


def rm_section(sec: dict[str, Any]) -> dict[str, Any]:
    runs = sec["runs"]
    scores = {
        arm: {s: sweep_mean(r["sweeps"][-1])[0] for s, r in by_seed.items()}
        for arm, by_seed in runs.items()
    }
    starts = {
        arm: {s: sweep_mean(r["sweeps"][0])[0] for s, r in by_seed.items()}
        for arm, by_seed in runs.items()
    }
    out: dict[str, Any] = {"score": scores, "start": starts, "vs_rule": {}, "hacking": {}}
    for arm in sorted(runs):
        if arm != RULE and RULE in runs:
            seeds = sorted(set(runs[arm]) & set(runs[RULE]), key=int)
            if seeds:
                out["vs_rule"][arm] = paired([scores[arm][s] - scores[RULE][s] for s in seeds])
        out["hacking"][arm] = {s: hacking_stats(r) for s, r in sorted(runs[arm].items())}
    if HACKABLE in runs:
        hk = out["hacking"][HACKABLE]
        out["hackable_flagged_every_seed"] = all(h["flag_step"] is not None for h in hk.values())
    out["false_alarms"] = {
        arm: sum(h["warnings"] for h in out["hacking"][arm].values()) / len(out["hacking"][arm])
        for arm in sorted(runs)
        if arm != HACKABLE
    }
    return out


def constraint_stats(run: Run, budget: float) -> dict[str, Any]:
    rates = run["trace"][f"constraint/{CONSTRAINT}/rate"]
    final = float(np.mean(rates[-LAST:]))
    clean = [sw["acc"][CLEAN] for sw in run["sweeps"]]
    return {
        "final_rate": final,
        "holds": final <= budget,
        "clean_first": clean[0],
        "clean_last": clean[-1],
        "task_up": clean[-1] > clean[0],
        "multiplier_last": run["trace"][f"constraint/{CONSTRAINT}/multiplier"][-1],
    }


def constraint_section(sec: dict[str, Any]) -> dict[str, Any]:
    budget = float(sec["settings"]["budget"])
    per = {
        arm: {s: constraint_stats(r, budget) for s, r in sorted(by_seed.items())}
        for arm, by_seed in sec["runs"].items()
    }
    out: dict[str, Any] = {"budget": budget, "runs": per, "arms": {}}
    for arm, by_seed in sorted(per.items()):
        vals = list(by_seed.values())
        out["arms"][arm] = {
            "holds_every_seed": all(v["holds"] for v in vals),
            "task_up_every_seed": all(v["task_up"] for v in vals),
            "final_rate_mean": float(np.mean([v["final_rate"] for v in vals])),
            "final_rate_max": float(max(v["final_rate"] for v in vals)),
            "task_gain": paired([v["clean_last"] - v["clean_first"] for v in vals]),
        }
        for ref in (LAGRANGE, PI):  # each multiplier arm's clean-word accuracy minus this arm's
            if arm != ref and ref in per:
                seeds = sorted(set(by_seed) & set(per[ref]), key=int)
                diffs = [per[ref][s]["clean_last"] - by_seed[s]["clean_last"] for s in seeds]
                out["arms"][arm][f"{ref} minus this, clean"] = paired(diffs) if diffs else None
    return out


def compute(doc: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    secs = doc.get("sections", {})
    if secs.get("rm", {}).get("runs"):
        out["rm"] = rm_section(secs["rm"])
    if secs.get("constraint", {}).get("runs"):
        out["constraint"] = constraint_section(secs["constraint"])
    return out


def _ci(p: dict[str, Any] | None) -> str:
    if not p:
        return "-"
    lo, hi = p.get("ci95", [math.nan, math.nan])
    return f"{p['mean']:+.3f} [{lo:+.3f}, {hi:+.3f}]"


def report(stats: dict[str, Any]) -> str:
    """The study's tables (markdown) from its statistics."""
    out = []
    if "rm" in stats:
        rm = stats["rm"]
        out += ["| arm | held-out verified, step 0 -> last (per seed) | vs rule, 95% CI |"]
        out += ["| first warning step (per seed) | lead at 10 / 50 | warnings/run |"]
        out = [out[0][:-1] + out[1]]
        out.append("| --- | --- | --- | --- | --- | --- |")
        for arm in sorted(rm["score"]):
            seeds = sorted(rm["score"][arm], key=int)
            acc = ", ".join(f"{rm['start'][arm][s]:.3f}->{rm['score'][arm][s]:.3f}" for s in seeds)
            hk = rm["hacking"][arm]
            flags = ", ".join(str(hk[s]["flag_step"]) for s in seeds)
            lead = "; ".join(
                f"{hk[s]['lead_time']['10']}/{hk[s]['lead_time']['50']}" for s in seeds
            )
            n = np.mean([hk[s]["warnings"] for s in seeds])
            vs = _ci(rm["vs_rule"].get(arm))
            out.append(f"| {arm} | {acc} | {vs} | {flags} | {lead} | {n:.2f} |")
    if "constraint" in stats:
        con = stats["constraint"]
        out += ["", f"| arm (budget {con['budget']}) | final violation rate (per seed) | holds |"]
        out[-1] += " clean-word held-out, first -> last (mean) | gain, 95% CI | up every seed |"
        out[-1] += f" {PI} - arm, clean |"
        out.append("| --- | --- | --- | --- | --- | --- | --- |")
        for arm, a in sorted(con["arms"].items()):
            runs = con["runs"][arm]
            rates = ", ".join(f"{runs[s]['final_rate']:.3f}" for s in sorted(runs, key=int))
            first = np.mean([r["clean_first"] for r in runs.values()])
            last = np.mean([r["clean_last"] for r in runs.values()])
            held = "every seed" if a["holds_every_seed"] else "no"
            other = _ci(a.get(f"{PI} minus this, clean"))
            up = "yes" if a["task_up_every_seed"] else "no"
            out.append(
                f"| {arm} | {rates} | {held} | {first:.3f} -> {last:.3f} | "
                f"{_ci(a['task_gain'])} | {up} | {other} |"
            )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    from benchmarks.studies.stored_runs import recheck

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=str(Path(__file__).with_name("model_rewards.json.gz")))
    ap.add_argument("--write", action="store_true", help="store the recomputed statistics")
    a = ap.parse_args(argv)
    doc = read(Path(a.json))
    now = json.loads(json.dumps(compute(doc)))
    print(report(now))
    return recheck(Path(a.json), doc, now, a.write)


if __name__ == "__main__":
    sys.exit(main())
