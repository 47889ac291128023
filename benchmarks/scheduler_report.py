"""Tables, pictures and the W&B summary of ``make bench-scheduler`` (scheduler_real.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


def table(results: dict[str, Any]) -> str:
    head = f"{'arm':30s} {'mean acc':>8s} {'worst':>6s} {'#regr':>5s} {'rollouts/step':>13s}"
    lines = [head + f" {'wall s':>7s}  per seed mean acc"]
    for arm, runs in results.items():
        m = {k: np.mean([r[k] for r in runs.values()]) for k in ("mean_acc", "worst_acc")}
        reg = np.mean([r["regressions"] for r in runs.values()])
        rps = np.mean([r["rollouts_per_step"] for r in runs.values()])
        wall = np.mean([r["wall_s"] for r in runs.values()])
        seeds = " ".join(f"{s}:{r['mean_acc']:.3f}" for s, r in runs.items())
        lines.append(
            f"{arm:30s} {m['mean_acc']:8.3f} {m['worst_acc']:6.3f} {reg:5.1f} {rps:13.0f} "
            f"{wall:7.0f}  {seeds}"
        )
    return "\n".join(lines)


def mean_final(runs: dict[str, Any], key: str = "final") -> dict[str, float]:
    """Per-domain accuracy (``final`` or ``start``) averaged over a dict of runs."""
    doms = sorted({d for r in runs.values() for d in r[key]})
    return {d: float(np.mean([r[key][d] for r in runs.values() if d in r[key]])) for d in doms}


def draw(results: dict[str, Any], prefix: Path) -> list[Path]:
    """``<prefix>_radar.png`` (final accuracy per domain per arm) and ``<prefix>_curves.png``."""
    from megatron_rl.scheduler.curves import _plt, _save, curve_data
    from megatron_rl.scheduler.radar import draw_radar

    first = next(iter(results.values()))
    start = mean_final(first, "start")
    labels = list(start)
    lines = {"start": np.array([start[d] for d in labels])}
    for arm, runs in results.items():
        fin = mean_final(runs)
        lines[arm] = np.array([fin.get(d, np.nan) for d in labels])
    short = [d.split("/", 1)[-1] for d in labels]
    radar = draw_radar(short, lines, f"{prefix}_radar.png", "final held-out accuracy per domain")
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 5))
    for arm, runs in results.items():
        per_run = []
        for r in runs.values():
            curves = curve_data(r["run_dir"]).curves
            steps = sorted({s for pts in curves.values() for s, _ in pts})
            per_run.append([np.mean([dict(p)[s] for p in curves.values()]) for s in steps])
        n = min(len(p) for p in per_run)
        ax.plot(steps[:n], np.mean([p[:n] for p in per_run], axis=0), "-o", ms=3, label=arm)
    ax.set_xlabel("step")
    ax.set_ylabel("mean held-out accuracy (mean over seeds)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return [radar, _save(fig, plt, Path(f"{prefix}_curves.png"))]


def temperature_table(results: dict[str, Any]) -> str:
    """Per arm and domain (mean over seeds): sampling temperature, share of generated groups
    with reward variance, held-out accuracy at the start and at the end."""
    lines = [f"{'arm':26s} {'domain':22s} {'mean T':>6s} {'mixed':>6s} {'start':>6s} {'final':>6s}"]
    for arm, runs in results.items():
        for d in mean_final(runs):
            per = [r for r in runs.values() if d in r["final"]]
            t = np.mean([r["mean_temperature"].get(d, 1.0) for r in per])
            mixed = np.mean([r["mixed_share"].get(d, np.nan) for r in per])
            start = np.mean([r["start"][d] for r in per])
            final = np.mean([r["final"][d] for r in per])
            lines.append(f"{arm:26s} {d:22s} {t:6.2f} {mixed:6.3f} {start:6.3f} {final:6.3f}")
    return "\n".join(lines)


def draw_temperature(results: dict[str, Any], path: Path) -> Path:
    """Per domain (columns): share of generated groups with reward variance and held-out
    accuracy against step (rows), one line per arm, mean over seeds."""
    from megatron_rl.scheduler.curves import _plt, _save, curve_data, read_jsonl, series

    plt = _plt()
    domains = sorted({d for runs in results.values() for r in runs.values() for d in r["final"]})
    fig, axes = plt.subplots(2, len(domains), figsize=(5 * len(domains), 7), squeeze=False)
    for arm, runs in results.items():
        for j, d in enumerate(domains):
            mixed, acc = [], []
            for r in runs.values():
                rows = read_jsonl(Path(r["run_dir"]) / "metrics.jsonl")
                mixed.append(series(rows, f"sched/{d}/zero_var_frac"))
                acc.append(curve_data(r["run_dir"]).curves.get(d, []))
            for ax, pts, invert in ((axes[0][j], mixed, True), (axes[1][j], acc, False)):
                n = min(len(p) for p in pts)
                if n == 0:
                    continue
                xs = [s for s, _ in pts[0][:n]]
                ys = np.mean([[v for _, v in p[:n]] for p in pts], axis=0)
                ax.plot(xs, 1 - ys if invert else ys, "-", lw=1.5, label=arm)
    for j, d in enumerate(domains):
        axes[0][j].set_title(d)
        axes[0][j].set_ylabel("groups with reward variance")
        axes[1][j].set_ylabel("held-out accuracy (greedy)")
        axes[1][j].set_xlabel("step")
        for ax in (axes[0][j], axes[1][j]):
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    return _save(fig, plt, path)


def log_wandb(
    mode: str, runs: Path, name: str, doc: dict[str, Any], results: dict[str, Any], pngs: list[Path]
) -> None:
    """One W&B run per experiment (in ``runs/summary-<name>``) with the per-arm per-seed table
    and the pictures."""
    if mode == "disabled":
        return
    from megatron_rl.tracking.config import TrackingConfig
    from megatron_rl.tracking.tracker import Tracker

    run_dir = runs / f"summary-{name}"
    tracker = Tracker(
        TrackingConfig(wandb=mode), run_dir, {"arms": doc["arms"], "domains": doc["domains"]}
    )
    cols = ["arm", "seed", "mean_acc", "worst_acc", "regressions", "rollouts_per_step", "wall_s"]
    rows = [
        [arm, s] + [r[c] for c in cols[2:]] for arm, rs in results.items() for s, r in rs.items()
    ]
    tracker.table(0, f"scheduler_real_{name}", cols, rows)
    for p in pngs:
        tracker.image(0, p.stem, p)
    tracker.finish()
