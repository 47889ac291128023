"""The many-domain study's tables, from its stored statistics (``many_stats.py``)."""

from __future__ import annotations

import math
from typing import Any


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


def report(doc: dict[str, Any], screen: dict[str, Any], section: str) -> str:
    """One section's table: per arm the means over its seeds and the paired differences."""
    st = doc.get("stats", {}).get(section)
    if not st:
        return f"section {section}: no runs yet"
    sec = doc["sections"][section]
    lines = [
        f"section {section}: {sec['settings']}; primary = mean of {len(screen['primary'])} "
        "registered domains at the last sweep (sampled pass@1, T = 1)",
        f"{'arm':34s} seeds primary   all   signal  regr  guard  worst family",
    ]
    for arm, a in st["arms"].items():
        runs = st["runs"][arm]
        worst = max(
            {r["worst_family"] for r in runs.values()},
            key=lambda f: sum(r["worst_family"] == f for r in runs.values()),
        )
        lines.append(
            f"{arm:34s} {len(a['seeds']):5d} {a['primary']:.4f} {a['all']:.4f} "
            f"{a['signal_share']:.3f} {a['regressions']:5.2f} {a['guard_events']:5.2f}  "
            f"{worst} ({a['worst_family_mean']:.3f})"
        )
    for arm, a in st["arms"].items():
        if "vs_baseline_primary" in a:
            lines.append(f"{arm} - baseline, primary: {_ci(a['vs_baseline_primary'])}")
            lines.append(f"{' ' * len(arm)}   all domains: {_ci(a['vs_baseline_all'])}")
            lines.append(f"{' ' * len(arm)}   signal share: {_ci(a['vs_baseline_signal_share'])}")
    secs = [r["seconds"] for runs in sec["runs"].values() for r in runs.values()]
    if secs:
        mean = {k: sum(s[k] for s in secs) / len(secs) for k in secs[0]}
        share = mean["eval"] / mean["wall"] if mean["wall"] else math.nan
        lines.append(
            "seconds per run (mean): "
            + ", ".join(f"{k} {v:.0f}" for k, v in mean.items())
            + f"; held-out sweeps are {share:.0%} of the wall"
        )
    return "\n".join(lines)
