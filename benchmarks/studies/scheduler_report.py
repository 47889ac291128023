"""Tables and pictures of ``make bench-scheduler`` (scheduler_real.py, scheduler_pair.py), drawn
from a JSON section's per-run extract and its statistics (scheduler_stats.py)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np


def _ci(c: dict[str, Any] | None) -> str:
    if not c:
        return ""
    lo, hi = c.get("ci95", [math.nan, math.nan])
    return f"{c['mean']:+.4f} [{lo:+.4f}, {hi:+.4f}] lb {c.get('lower95', math.nan):+.4f} {c['positive']}/{c['n']}"  # noqa: E501


def table(sec: dict[str, Any]) -> str:
    """Per arm: primary / greedy score (mean over seeds, mean eval-sampling SE), the paired
    difference to the baseline with its 95% t interval, one-sided lower bound and sign count,
    regressions and guard events per run."""
    st = sec["stats"]
    lines = [
        f"{'arm':44s} {'seeds':>5s} {'pass@1':>7s} {'(se)':>6s} {'greedy':>6s} {'#regr':>5s} "
        f"{'#guard':>6s}  paired vs baseline: mean [95% CI] lower bound, positive/n"
    ]
    for arm, s in st["arms"].items():
        ps = s["per_seed"].values()
        se = float(np.mean([v["primary_se"] for v in ps]))
        vs = st["vs_baseline"].get(arm, {}).get("primary")
        lines.append(
            f"{arm:44s} {len(s['per_seed']):5d} {s['primary_mean']:7.4f} {se:6.4f} "
            f"{s['greedy_mean']:6.3f} {s['regressions_mean']:5.2f} {s['guard_events_mean']:6.2f}"
            f"  {_ci(vs)}"
        )
    for name, c in st.get("contrasts", {}).items():
        lines.append(f"{name} ({c['arm']} - {c['baseline']}): {_ci(c)}")
    extra = {k: st[k] for k in ("headroom", "win", "share_of_oracle_gain") if k in st}
    b = st["budget"]
    per_step = f"generated {b['generated']}, trained {b['trained']} groups/step, equal {b['equal']}"
    tau = st["regression_threshold"]
    lines.append(f"regression threshold {tau:.4f}; competing arms {per_step}")
    lines.append(f"verdicts: {extra}")
    return "\n".join(lines)


def mean_curve(runs: dict[str, Any], metric: str = "primary") -> tuple[list[int], np.ndarray]:
    """Steps and the mean-over-domains score at each sweep, averaged over a dict of runs."""
    per = []
    for r in runs.values():
        per.append([np.mean([v[metric] for v in sw["domains"].values()]) for sw in r["sweeps"]])
    n = min(len(p) for p in per)
    steps = [sw["step"] for sw in next(iter(runs.values()))["sweeps"][:n]]
    return steps, np.mean([p[:n] for p in per], axis=0)


def draw(sec: dict[str, Any], prefix: Path) -> list[Path]:
    """``<prefix>_curves.png``: mean sampled pass@1 per arm against step (mean over seeds);
    ``<prefix>_domains.png``: final per-domain pass@1 per arm (mean over seeds)."""
    from megatron_rl.scheduler.curves import _plt, _save

    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 5))
    for arm, runs in sec["runs"].items():
        steps, ys = mean_curve(runs)
        ax.plot(steps, ys, "-o", ms=3, label=f"{arm} ({len(runs)} seeds)")
    ax.set_xlabel("step")
    ax.set_ylabel("held-out sampled pass@1, mean over domains")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    curves = _save(fig, plt, Path(f"{prefix}_curves.png"))
    fig, ax = plt.subplots(figsize=(10, 5))
    arms = list(sec["runs"])
    domains = list(next(iter(next(iter(sec["runs"].values())).values()))["sweeps"][-1]["domains"])
    width = 0.8 / len(arms)
    for k, arm in enumerate(arms):
        fin = [
            np.mean([r["sweeps"][-1]["domains"][d]["primary"] for r in sec["runs"][arm].values()])
            for d in domains
        ]
        ax.bar(np.arange(len(domains)) + k * width, fin, width, label=arm)
    ax.set_xticks(np.arange(len(domains)) + 0.4, [d.split("/")[-1] for d in domains], rotation=30)
    ax.set_ylabel("final held-out sampled pass@1 (mean over seeds)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return [curves, _save(fig, plt, Path(f"{prefix}_domains.png"))]


def draw_seesaw(sec: dict[str, Any], path: Path) -> Path:
    """One column per seed: B's (solid) and A's (dotted) held-out pass@1 against step in the
    adaptive runs with and without the guard's reaction and in the "train A only" runs (black), B's
    onset (dashed) and the guard's events on B (red: regression, green: recovery); below, B's
    share of the mix."""
    from megatron_rl.scheduler.curves import _plt, _save

    a_dom, b_dom = sec["pair"]
    roles, runs, st = sec["roles"], sec["runs"], sec["stats"]
    seeds = sorted({s for role in roles.values() for s in runs.get(role, {})}, key=int)
    plt = _plt()
    fig, axes = plt.subplots(2, max(1, len(seeds)), figsize=(5 * max(1, len(seeds)), 7),
                             squeeze=False, sharex=True)  # fmt: skip
    for j, s in enumerate(seeds):
        top, low = axes[0][j], axes[1][j]
        for role, colour in (("guard", "tab:blue"), ("no_guard", "tab:orange"), ("a_only", "k")):
            r = runs.get(roles[role], {}).get(s)
            if r is None:
                continue
            xs = [sw["step"] for sw in r["sweeps"]]
            for dom, style in ((b_dom, "-o"), (a_dom, ":")):
                ys = [sw["domains"][dom]["primary"] for sw in r["sweeps"]]
                top.plot(xs, ys, style, color=colour, ms=3, label=f"{roles[role]}: {dom}")
            share = [sw["domains"][b_dom]["share"] for sw in r["sweeps"]]
            low.plot(xs, share, "-", color=colour, label=roles[role])
            if role != "no_guard":  # the guard flags in every run; it reacts only in "guard"
                for e in (e for e in r["events"] if e["domain"] == b_dom):
                    mark = "rv" if e["event"] == "regression" else "g^"
                    top.plot([e["step"]], [e["score"]], mark, ms=9)
        k = st["per_seed"].get(s, {}).get("onset")
        if k is not None:  # (the onset is measured on the guard's run)
            step = runs[roles["guard"]][s]["sweeps"][k]["step"]
            top.axvline(step, ls="--", color="grey", lw=1)
        top.set_title(f"seed {s}")
        top.set_ylabel("held-out sampled pass@1")
        low.set_ylabel(f"share of the mix: {b_dom.split('/')[-1]}")
        low.set_xlabel("step")
        for ax in (top, low):
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    axes[1][0].legend(fontsize=7)
    return _save(fig, plt, path)
