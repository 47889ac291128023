"""The model-reward study's picture (``model_rewards.png``), drawn from its stored runs: held-out
verified accuracy per arm of the ``rm`` part with the first reward-hacking warning of each run
marked, and the ``constraint`` part's violation rate and clean-word accuracy per arm. Every
seed is a faint line behind its arm's mean."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.studies.model_rewards_stats import CLEAN, CONSTRAINT, sweep_mean


def figure(doc: dict[str, Any], out: Path) -> Path | None:
    secs = doc.get("sections", {})
    panels = [p for p in ("rm", "constraint") if secs.get(p, {}).get("runs")]
    if not panels:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = 1 + 2 * ("constraint" in panels) if "rm" in panels else 2
    fig, axes = plt.subplots(1, n, figsize=(5.2 * n, 4.2))
    axes = list(np.atleast_1d(axes))
    if "rm" in panels:
        ax = axes.pop(0)
        for i, (arm, runs) in enumerate(sorted(secs["rm"]["runs"].items())):
            color = plt.get_cmap("tab10")(i)
            curves = []
            for r in runs.values():
                steps = [sw["step"] for sw in r["sweeps"]]
                acc = [sweep_mean(sw)[0] for sw in r["sweeps"]]
                ax.plot(steps, acc, color=color, alpha=0.25, lw=0.8)
                curves.append(acc)
                flags = [w["step"] for w in r["warnings"]]
                if flags:  # the first warning, on the curve at that step
                    ax.plot(min(flags), np.interp(min(flags), steps, acc), "v", color=color)
            if len({len(c) for c in curves}) == 1:
                ax.plot(steps, np.mean(curves, axis=0), color=color, lw=2, label=arm)
        ax.set(xlabel="step", ylabel="held-out verified accuracy (mean of domains)")
        ax.set_title("rewarded by: (v = first hacking warning)", fontsize=9)
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    if "constraint" in panels:
        sec = secs["constraint"]
        rate_ax, clean_ax = axes[0], axes[1]
        for i, (arm, runs) in enumerate(sorted(sec["runs"].items())):
            color = plt.get_cmap("tab10")(i + 4)
            rates = [np.asarray(r["trace"][f"constraint/{CONSTRAINT}/rate"]) for r in runs.values()]
            for r in rates:
                rate_ax.plot(r, color=color, alpha=0.2, lw=0.7)
            if len({len(r) for r in rates}) == 1:
                rate_ax.plot(np.mean(rates, axis=0), color=color, lw=1.8, label=arm)
            clean = [[sw["acc"][CLEAN] for sw in r["sweeps"]] for r in runs.values()]
            steps = [sw["step"] for sw in next(iter(runs.values()))["sweeps"]]
            if len({len(c) for c in clean}) == 1:
                clean_ax.plot(steps, np.mean(clean, axis=0), color=color, lw=1.8, label=arm)
        rate_ax.axhline(sec["settings"]["budget"], color="k", ls="--", lw=0.8, label="budget")
        rate_ax.set(xlabel="step", ylabel="share of samples violating (no letter e)")
        clean_ax.set(xlabel="step", ylabel=f"held-out accuracy, {CLEAN}")
        rate_ax.legend(fontsize=7)
        for ax in (rate_ax, clean_ax):
            ax.grid(alpha=0.3)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90, bbox_inches="tight")
    plt.close(fig)
    return out
