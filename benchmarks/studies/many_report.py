"""The many-domain study's tables, from its stored statistics (``many_stats.py``)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.studies.many_stats import REPORT_SECTIONS, section_runs


def _ci(p: dict[str, Any] | None) -> str:
    if not p:
        return ""
    if "ci95" not in p:
        return f"{p['mean']:+.4f}"
    lo, hi = p["ci95"]
    return (
        f"{p['mean']:+.4f} (SE {p['se']:.4f}) [{lo:+.4f}, {hi:+.4f}] "
        f"lb {p['lower95']:+.4f}, {p['positive']}/{p['n']} positive"
    )


def _decision(d: dict[str, Any]) -> str:
    """A registered decision's verdict: it holds or fails, and only once all its seeds are in."""
    verdict = "holds" if d["holds"] else "fails"
    return verdict if d["complete"] else f"not decided yet ({verdict} so far)"


def report(doc: dict[str, Any], screen: dict[str, Any], section: str) -> str:
    """One section's table: per arm the means over its seeds (to target: the median generated
    rollouts to +0.01 primary over the run's start, and how many runs got there) and the paired
    differences (``report``: the headroom and arms parts together, with the registered
    contrasts and the win's criteria)."""
    st = doc.get("stats", {}).get(section)
    if not st:
        return f"section {section}: no runs yet"
    names = REPORT_SECTIONS if section == "report" else (section,)
    secs = [doc["sections"][n] for n in names]
    lines = [
        f"section {section}: {secs[0]['settings']}; primary = mean of {len(screen['primary'])} "
        "registered domains at the last sweep (sampled pass@1, T = 1)",
        f"{'arm':34s} seeds primary   all   signal  regr  guard  to target  worst family",
    ]
    per = section_runs(doc["stats"], section)
    for arm, a in st["arms"].items():
        runs = per[arm]
        worst = max(  # the most frequent worst family (ties: the first by name)
            sorted({r["worst_family"] for r in runs.values()}),
            key=lambda f: sum(r["worst_family"] == f for r in runs.values()),
        )
        reach = [r["rollouts_to_target"] for r in runs.values() if r["rollouts_to_target"]]
        target = f"{np.median(reach) / 1e3:5.0f}k {len(reach)}/{len(runs)}" if reach else "never"
        lines.append(
            f"{arm:34s} {len(a['seeds']):5d} {a['primary']:.4f} {a['all']:.4f} "
            f"{a['signal_share']:.3f} {a['regressions']:5.2f} {a['guard_events']:5.2f} "
            f"{target:>10s}  {worst} ({a['worst_family_change']:.3f})"
        )
    for arm, a in st["arms"].items():
        if "vs_baseline_primary" in a:
            lines.append(f"{arm} - baseline, primary: {_ci(a['vs_baseline_primary'])}")
            lines.append(f"{' ' * len(arm)}   all domains: {_ci(a['vs_baseline_all'])}")
            lines.append(f"{' ' * len(arm)}   signal share: {_ci(a['vs_baseline_signal_share'])}")
            lines.append(f"{' ' * len(arm)}   regressions: {_ci(a['vs_baseline_regressions'])}")
    for name, c in st.get("contrasts", {}).items():
        lines.append(f"{name}, primary: {_ci(c['primary'])}")
        lines.append(f"{' ' * len(name)}   all domains: {_ci(c['all'])}")
        lines.append(f"{' ' * len(name)}   regressions: {_ci(c['regressions'])}")
    rep = doc["stats"].get("replication") if section == "screened" else None
    if rep and "fresh" in rep:
        lines.append(f"replication of the pre-screen (registered): {_decision(rep)}")
        lines.append(f"  fresh seeds, in the run - baseline: {_ci(rep['fresh'])}")
        lines.append(f"  pooled with the report seeds: {_ci(rep['pooled'])}")
    if "on_top" in st:
        lines.append(
            f"the adaptive mix on top of the pre-screen (registered): {_decision(st['on_top'])}"
        )
    if "win" in st:
        win = st["win"]
        verdict = "met" if win["met"] else "not met" if win["complete"] else "not decided yet"
        label = "registered" if section == "report" else "the issue's criteria, descriptive here"
        lines.append(f"the win ({label}, all three): {verdict}")
        for k, v in win["criteria"].items():
            lines.append(f"  {'holds' if v['holds'] else 'fails'} on {v['seeds']} seeds: {k}")
    timings = [
        r["seconds"]
        for sec in secs
        for runs in sec["runs"].values()
        for r in runs.values()
        if "seconds" in r
    ]
    if timings:
        mean = {k: sum(t[k] for t in timings) / len(timings) for k in timings[0]}
        share = mean["eval"] / mean["wall"] if mean["wall"] else math.nan
        lines.append(
            "seconds per run (mean): "
            + ", ".join(f"{k} {v:.0f}" for k, v in mean.items())
            + f"; held-out sweeps are {share:.0%} of the wall"
        )
    return "\n".join(lines)


def curves_png(doc: dict[str, Any], section: str, out: Path) -> Path | None:
    """Mean primary score of each arm against generated rollouts (left) and step (right), with
    every seed's curve faint behind its mean: the uniform + filter curve shows whether the
    baseline was still rising at the end."""
    st = doc.get("stats", {}).get(section)
    if not st:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for i, (arm, runs) in enumerate(section_runs(doc["stats"], section).items()):
        color = plt.get_cmap("tab10")(i % 10)
        curves = [np.asarray(r["curve"], dtype=float) for r in runs.values()]
        for c in curves:
            axes[0].plot(c[:, 1] / 1e3, c[:, 2], color=color, alpha=0.2, lw=0.8)
            axes[1].plot(c[:, 0], c[:, 2], color=color, alpha=0.2, lw=0.8)
        same = len({c.shape for c in curves}) == 1 and all(
            np.array_equal(c[:, 0], curves[0][:, 0]) for c in curves
        )
        if same:  # a mean only where the seeds share their sweep steps
            m = np.mean(curves, axis=0)
            label = f"{arm} ({len(curves)} seeds)"
            axes[0].plot(m[:, 1] / 1e3, m[:, 2], color=color, marker="o", lw=2, label=label)
            axes[1].plot(m[:, 0], m[:, 2], color=color, marker="o", lw=2)
    axes[0].set_xlabel("generated rollouts (thousands)")
    axes[1].set_xlabel("step")
    axes[0].set_ylabel("held-out sampled pass@1, primary set")
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"many-domain study, section {section}", fontsize=10)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90, bbox_inches="tight")
    plt.close(fig)
    return out
