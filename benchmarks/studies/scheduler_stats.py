"""The scheduler benchmark's statistics, recomputed from its committed per-run extract.

``benchmarks/studies/scheduler_real.json.gz`` holds, per run, the raw extract (``runs``: per-sweep
per-domain scores with their standard errors and distinct-prompt counts, groups generated and
trained per step, the guard's events) and the statistics computed from it (``stats``). This
module is the one place those statistics are computed; run as a script it recomputes them from
the extract alone and checks that they agree with the stored ones (exit 1 if not):

    .venv/bin/python -m benchmarks.studies.scheduler_stats [PATH.json[.gz]] [--write]

Definitions (docs/scheduler.md, "Pre-registration"):

* a run's score: the mean over domains of the final sweep's per-domain score (primary: sampled
  pass@1 at T = 1; secondary: greedy accuracy); its eval-sampling standard error:
  ``sqrt(sum_d se_d^2) / D`` from the per-domain standard errors over distinct prompts;
* per seed, the paired difference arm - baseline; over seeds its mean, standard error, 95% t
  interval, one-sided 95% lower bound and sign count;
* headroom: the oracle's paired mean gain is above 2 of its standard errors;
* the win: the adaptive arm's one-sided lower bound is above 0 and its mean gain is at least half
  the oracle's; where a section records ``looks`` (the registered tests of that arm so far, its
  own included), also its one-sided lower bound at ``1 - 0.05 / looks`` (Bonferroni), reported
  beside the registered one;
* a regression: a domain whose final score is more than ``tau`` below its best sweep, with
  ``tau`` = 2 x the robust standard deviation (1.4826 x MAD) of the baseline arm's own
  sweep-to-sweep changes, pooled over its domains, sweeps and seeds.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import read_text, write_text

BASELINE = "uniform + filter"
ORACLE = "oracle static mix"
ADAPTIVE = "adaptive"
PROBE = "uniform + filter, 4x over-sampling (probe)"  # generates 4x: reported, not competing


def t_cdf(x: float, df: int) -> float:
    """Student-t CDF (Simpson integration of the density; |error| < 1e-7 for df >= 1)."""
    if x < 0:
        return 1.0 - t_cdf(-x, df)
    grid = np.linspace(0.0, x, 4001)
    log_c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    dens = np.exp(log_c - (df + 1) / 2 * np.log1p(grid**2 / df))
    h = grid[1] - grid[0] if x > 0 else 0.0
    area = h / 3 * (dens[0] + dens[-1] + 4 * dens[1:-1:2].sum() + 2 * dens[2:-1:2].sum())
    return 0.5 + float(area)


def t_quantile(q: float, df: int) -> float:
    """The ``q`` quantile of Student's t with ``df`` degrees of freedom (bisection)."""
    if not 0.5 <= q < 1.0 or df < 1:
        raise ValueError(f"t_quantile needs 0.5 <= q < 1 and df >= 1, got q={q}, df={df}")
    lo, hi = 0.0, 1000.0
    for _ in range(80):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_cdf(mid, df) < q else (lo, mid)
    return (lo + hi) / 2


def paired(diffs: list[float]) -> dict[str, Any]:
    """Mean, SE, 95% t interval, one-sided 95% lower bound and sign count of paired diffs."""
    d = np.asarray(diffs, dtype=float)
    n = d.size
    mean = float(d.mean())
    se = float(d.std(ddof=1) / math.sqrt(n)) if n > 1 else math.nan
    out: dict[str, Any] = {"n": n, "diffs": [float(x) for x in d], "mean": mean, "se": se}
    if n > 1:
        half = t_quantile(0.975, n - 1) * se
        out.update(ci95=[mean - half, mean + half], lower95=mean - t_quantile(0.95, n - 1) * se)
    out["positive"] = int((d > 0).sum())
    return out


def final_scores(run: dict[str, Any], metric: str) -> dict[str, dict[str, float]]:
    """The last sweep's per-domain ``{score, se}`` of ``metric`` ('primary' or 'greedy')."""
    last = run["sweeps"][-1]
    return {d: {"score": v[metric], "se": v.get(f"{metric}_se", math.nan)}
            for d, v in last["domains"].items()}  # fmt: skip


def run_score(run: dict[str, Any], metric: str = "primary") -> tuple[float, float]:
    """(mean over domains of the final score, its eval-sampling standard error)."""
    fin = final_scores(run, metric)
    scores = [v["score"] for v in fin.values()]
    ses = [v["se"] for v in fin.values()]
    return float(np.mean(scores)), float(math.sqrt(sum(s * s for s in ses)) / len(ses))


def sweep_changes(run: dict[str, Any], metric: str = "primary") -> list[float]:
    """Every domain's change between consecutive sweeps of one run."""
    out = []
    for prev, now in zip(run["sweeps"], run["sweeps"][1:], strict=False):
        out += [now["domains"][d][metric] - prev["domains"][d][metric] for d in now["domains"]]
    return out


def regression_threshold(runs: list[dict[str, Any]], metric: str = "primary") -> float:
    """2 x the robust SD (1.4826 x MAD) of the baseline runs' sweep-to-sweep changes."""
    ch = np.concatenate([sweep_changes(r, metric) for r in runs])
    return float(2 * 1.4826 * np.median(np.abs(ch - np.median(ch))))


def regressions(run: dict[str, Any], tau: float, metric: str = "primary") -> list[str]:
    """Domains whose final score is more than ``tau`` below their best sweep."""
    best: dict[str, float] = {}
    for sw in run["sweeps"]:
        for d, v in sw["domains"].items():
            best[d] = max(best.get(d, -math.inf), v[metric])
    fin = run["sweeps"][-1]["domains"]
    return sorted(d for d in fin if fin[d][metric] < best[d] - tau)


def compare(
    runs: dict[str, dict[str, Any]], arm: str, base: str, metric: str = "primary"
) -> dict[str, Any] | None:
    """Paired over the seeds both arms ran: arm - base."""
    seeds = sorted(set(runs.get(arm, {})) & set(runs.get(base, {})), key=int)
    if not seeds:
        return None
    diffs = [
        run_score(runs[arm][s], metric)[0] - run_score(runs[base][s], metric)[0] for s in seeds
    ]
    return {"arm": arm, "baseline": base, "seeds": [int(s) for s in seeds], **paired(diffs)}


def arm_summary(arm_runs: dict[str, dict[str, Any]], tau: float) -> dict[str, Any]:
    """Per arm: per-seed score and eval-sampling SE (both metrics), regressions, guard events."""
    per_seed = {}
    for s, r in arm_runs.items():
        p, p_se = run_score(r, "primary")
        g, g_se = run_score(r, "greedy")
        reg = regressions(r, tau)
        events = [e for e in r["events"] if e.get("event") == "regression"]
        per_seed[s] = {"primary": p, "primary_se": p_se, "greedy": g, "greedy_se": g_se,
                       "regressed": reg, "guard_regression_events": len(events)}  # fmt: skip
    vals = list(per_seed.values())
    return {
        "per_seed": per_seed,
        "primary_mean": float(np.mean([v["primary"] for v in vals])),
        "greedy_mean": float(np.mean([v["greedy"] for v in vals])),
        "regressions_mean": float(np.mean([len(v["regressed"]) for v in vals])),
        "guard_events_mean": float(np.mean([v["guard_regression_events"] for v in vals])),
    }


def budget_check(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Groups generated and trained per step, per arm over all its runs and steps; ``equal``:
    every step of every competing arm (all but the over-sampling probe) generated the same number
    and trained the same number."""
    per_arm = {
        arm: {
            "generated": sorted({n for r in rs.values() for n in r["groups_generated"]}),
            "trained": sorted({n for r in rs.values() for n in r["groups_trained"]}),
        }
        for arm, rs in runs.items()
    }
    competing = [v for arm, v in per_arm.items() if arm != PROBE]
    gen = sorted({n for v in competing for n in v["generated"]})
    tr = sorted({n for v in competing for n in v["trained"]})
    return {"generated": gen, "trained": tr, "equal": len(gen) == len(tr) == 1, "arms": per_arm}


def _se2(a: dict[str, float], b: dict[str, float]) -> float:
    """SE of the difference of two sweeps' scores (unpaired: conservative)."""
    return math.sqrt(a["primary_se"] ** 2 + b["primary_se"] ** 2)


def change(run: dict[str, Any], domain: str) -> dict[str, float]:
    """Final minus start score of a domain, its SE and the change in SEs."""
    first, last = (run["sweeps"][i]["domains"][domain] for i in (0, -1))
    diff, se = last["primary"] - first["primary"], _se2(first, last)
    return {"start": first["primary"], "final": last["primary"], "diff": diff, "se": se,
            "z": diff / se if se > 0 else math.nan}  # fmt: skip


def onset(run: dict[str, Any], domain: str) -> int | None:
    """Index of the first sweep at which ``domain`` is more than 2 SE below its start."""
    first = run["sweeps"][0]["domains"][domain]
    for k, sw in enumerate(run["sweeps"]):
        now = sw["domains"][domain]
        if first["primary"] - now["primary"] > 2 * _se2(first, now):
            return k
    return None


def back(run: dict[str, Any], domain: str, after: int) -> int | None:
    """Index of the first sweep after ``after`` at which ``domain`` is within 2 SE of its start."""
    first = run["sweeps"][0]["domains"][domain]
    for k, sw in enumerate(run["sweeps"]):
        now = sw["domains"][domain]
        if k > after and first["primary"] - now["primary"] <= 2 * _se2(first, now):
            return k
    return None


def first_flag(run: dict[str, Any], domain: str) -> int | None:
    """Index of the sweep at which the guard first raised a regression event for ``domain``."""
    steps = [sw["step"] for sw in run["sweeps"]]
    hits = [
        e["step"] for e in run["events"] if e["event"] == "regression" and e["domain"] == domain
    ]
    return steps.index(min(hits)) if hits and min(hits) in steps else None


def seesaw(doc: dict[str, Any]) -> dict[str, Any]:
    """The constructed pair: validity (training A alone raises A and lowers B, each by > 3 SE),
    onset of B's drop, the guard's first flag of B, and B's return with and without the guard."""
    a_dom, b_dom = doc["pair"]
    arms = doc["roles"]  # role -> arm name: "a_only", "guard", "no_guard"
    runs = doc["runs"]
    out: dict[str, Any] = {"validity": {}, "per_seed": {}}
    for s, r in runs.get(arms["a_only"], {}).items():
        a, b = change(r, a_dom), change(r, b_dom)
        out["validity"][s] = {"a": a, "b": b, "valid": bool(a["z"] > 3 and b["z"] < -3),
                              "onset": onset(r, b_dom), "flag": first_flag(r, b_dom)}  # fmt: skip
    for s, r in runs.get(arms["guard"], {}).items():
        other = runs.get(arms["no_guard"], {}).get(s)
        k = onset(r, b_dom)
        row: dict[str, Any] = {"onset": k, "flag": first_flag(r, b_dom)}
        row["caught"] = bool(k is not None and row["flag"] is not None and row["flag"] - k <= 2)
        row["back_guard"] = back(r, b_dom, k) if k is not None else None
        if other is not None:
            ko = onset(other, b_dom)
            row["onset_no_guard"] = ko
            row["back_no_guard"] = back(other, b_dom, ko) if ko is not None else None
        out["per_seed"][s] = row
    vals = list(out["validity"].values())
    out["valid_all_seeds"] = bool(vals) and all(v["valid"] for v in vals)
    rows = [v for v in out["per_seed"].values() if v["onset"] is not None]
    out["seeds_with_onset"] = len(rows)
    out["caught"] = sum(v["caught"] for v in rows)
    inf = math.inf
    out["back_sooner"] = sum(
        (v["back_guard"] if v["back_guard"] is not None else inf)
        < (v.get("back_no_guard") if v.get("back_no_guard") is not None else inf)
        for v in rows
    )
    return out


def compute(doc: dict[str, Any]) -> dict[str, Any]:
    """Every statistic of a section (``runs``: arm -> seed -> extract)."""
    if doc.get("kind") == "seesaw":
        return seesaw(doc)
    runs = doc["runs"]
    tau = regression_threshold(list(runs[BASELINE].values())) if BASELINE in runs else math.nan
    out: dict[str, Any] = {"regression_threshold": tau, "budget": budget_check(runs)}
    out["arms"] = {arm: arm_summary(r, tau) for arm, r in runs.items()}
    out["vs_baseline"] = {
        arm: {m: compare(runs, arm, BASELINE, m) for m in ("primary", "greedy")}
        for arm in runs
        if arm != BASELINE
    }
    for name, (arm, base) in doc.get("contrasts", {}).items():
        out.setdefault("contrasts", {})[name] = compare(runs, arm, base)
    oracle = out["vs_baseline"].get(ORACLE, {}).get("primary")
    adaptive_arm = doc.get("adaptive_arm", ADAPTIVE)  # the confirmation names its own
    adaptive = out["vs_baseline"].get(adaptive_arm, {}).get("primary")
    if oracle:
        out["headroom"] = bool(oracle["mean"] > 2 * oracle["se"])
    if oracle and adaptive:
        lower = adaptive.get("lower95", math.nan)  # (none with a single seed)
        out["win"] = bool(lower > 0 and adaptive["mean"] >= 0.5 * oracle["mean"])
        out["share_of_oracle_gain"] = adaptive["mean"] / oracle["mean"] if oracle["mean"] else None
        looks = int(doc.get("looks", 1))  # registered tests of this arm so far, this one included
        if looks > 1 and adaptive["n"] > 1:
            q = t_quantile(1.0 - 0.05 / looks, adaptive["n"] - 1)
            out["lower_adjusted"] = {"looks": looks, "lower": adaptive["mean"] - q * adaptive["se"]}
    return out


def close(a: Any, b: Any, tol: float = 1e-9) -> bool:
    """Recursive equality of JSON values, floats within ``tol`` (NaN equals NaN)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(close(a[k], b[k], tol) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(close(x, y, tol) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) or isinstance(b, float):
        fa, fb = float(a), float(b)
        return (math.isnan(fa) and math.isnan(fb)) or abs(fa - fb) <= tol * max(1.0, abs(fa))
    return bool(a == b)


def verdicts(st: dict[str, Any]) -> dict[str, Any]:
    """The pre-registered answers of one section, for the printout."""
    if "validity" in st:
        return {k: st[k] for k in ("valid_all_seeds", "seeds_with_onset", "caught", "back_sooner")}
    keys = ("headroom", "win", "share_of_oracle_gain", "lower_adjusted")
    out = {k: st[k] for k in keys if k in st}
    for arm, v in st["vs_baseline"].items():
        p = v["primary"]
        if p and p["n"] > 1:
            out[arm] = f"{p['mean']:+.4f} (se {p['se']:.4f}, lb {p['lower95']:+.4f}, n {p['n']})"
    for name, p in st.get("contrasts", {}).items():
        if p and p["n"] > 1:
            out[name] = f"{p['mean']:+.4f} [{p['ci95'][0]:+.4f}, {p['ci95'][1]:+.4f}]"
    if BASELINE in st["arms"]:
        out["baseline guard events / run"] = st["arms"][BASELINE]["guard_events_mean"]
    out["equal budget"] = st["budget"]["equal"]
    return out


def main(argv: list[str] | None = None) -> int:
    """Recompute every section's statistics from its runs; exit 1 if any disagrees with the
    stored ones. ``--write`` stores the recomputed statistics instead (after a change here)."""
    argv = sys.argv[1:] if argv is None else argv
    write = "--write" in argv
    argv = [x for x in argv if x != "--write"]
    path = Path(argv[0] if argv else Path(__file__).with_name("scheduler_real.json.gz"))
    doc = json.loads(read_text(path))
    bad = []
    for name, section in doc.get("sections", {}).items():
        again = json.loads(json.dumps(compute(section)))  # the same JSON round trip as stored
        if write:
            section["stats"] = again
        ok = close(again, section.get("stats"))
        print(f"{name}: {'agrees' if ok else 'DISAGREES'} with the stored statistics")
        print("  " + json.dumps(verdicts(again)))
        bad += [] if ok else [name]
    if write:
        write_text(path, json.dumps(doc, indent=1) + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
