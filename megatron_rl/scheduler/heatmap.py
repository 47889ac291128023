"""Held-out accuracy of hundreds of domains over a run, as one picture (``eval_heatmap.png``).

One row per domain, one column per held-out sweep, the cell's colour its accuracy; rows are
grouped by family (the radar's grouping: a domain's first tag, else its name's prefix) with the
family's name at the left of its band, and domains within a family keep their registry order
(a difficulty ladder reads easiest to hardest). The seesaw guard's ``regression`` events are
marked in the cell of the sweep that raised them (a red triangle), ``recovery`` with a green one.
A column of the change from the first sweep to the last sits at the right, on its own
diverging colour scale, so a domain that fell stands out even where its absolute accuracy is
low. Drawn from the run's own ``metrics.jsonl`` and ``events.jsonl`` (like the curves), so a
finished run can be redrawn:

    python -m megatron_rl.scheduler.heatmap RUN_DIR [--out heatmap.png]
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from megatron_rl.scheduler.curves import MARKS, curve_data


@dataclass
class HeatmapData:
    """What the heatmap draws: ``acc[i, j]`` is domain ``names[i]`` at sweep ``steps[j]``."""

    names: list[str]
    families: list[str]  # per row
    steps: list[int]
    acc: np.ndarray  # [rows, sweeps], nan where a sweep has no value for the domain
    marks: list[tuple[int, int, str]] = field(default_factory=list)  # (row, column, kind)


def heatmap_data(run_dir: str | Path, groups: dict[str, str] | None = None) -> HeatmapData:
    """Rows grouped by ``groups`` (domain -> family; default: the name's prefix before '/')."""
    data = curve_data(run_dir)
    groups = groups or {}
    fam = {n: groups.get(n, n.split("/", 1)[0]) for n in data.curves}
    order = {f: i for i, f in enumerate(sorted(set(fam.values())))}
    rank = {n: i for i, n in enumerate(groups)}  # the caller's (registry) order inside a family
    names = sorted(data.curves, key=lambda n: (order[fam[n]], rank.get(n, len(rank)), n))
    steps = sorted({s for pts in data.curves.values() for s, _ in pts})
    col = {s: j for j, s in enumerate(steps)}
    acc = np.full((len(names), len(steps)), np.nan)
    for i, n in enumerate(names):
        for s, v in data.curves[n]:
            acc[i, col[s]] = v
    row = {n: i for i, n in enumerate(names)}
    marks = []
    for s, domain, kind, _ in data.marks:
        at = [j for j, t in enumerate(steps) if t <= s]  # the sweep that raised it
        if domain in row and at:
            marks.append((row[domain], at[-1], kind))
    return HeatmapData(names, [fam[n] for n in names], steps, acc, marks)


def heatmap_png(
    run_dir: str | Path, path: str | Path | None = None, groups: dict[str, str] | None = None
) -> Path:
    """Draw ``eval_heatmap.png`` (default: into the run directory); returns its path."""
    from megatron_rl.scheduler.curves import _plt, _save

    plt = _plt()
    d = heatmap_data(run_dir, groups)
    rows, cols = max(1, len(d.names)), max(1, len(d.steps))
    height = min(60.0, max(3.0, 0.07 * rows + 1.5))
    size = (min(14.0, 4.0 + 0.45 * cols), height)
    ratios = {"width_ratios": [max(1, cols), 1.2]}
    fig, (ax, ax_d) = plt.subplots(1, 2, figsize=size, sharey=True, gridspec_kw=ratios)
    im = ax.imshow(d.acc, aspect="auto", cmap="viridis", vmin=0, vmax=1, interpolation="nearest")
    ax.set_xticks(range(len(d.steps)), [str(s) for s in d.steps], fontsize=7)
    ax.set_xlabel("step of the held-out sweep")
    change = d.acc[:, -1:] - d.acc[:, :1] if d.steps else np.zeros((rows, 1))
    lim = max(0.05, float(np.nanmax(np.abs(change)))) if np.isfinite(change).any() else 0.05
    im_d = ax_d.imshow(change, aspect="auto", cmap="RdBu", vmin=-lim, vmax=lim)
    ax_d.set_xticks([0], ["last - first"], fontsize=7)
    bounds = [0] + [i for i in range(1, len(d.names)) if d.families[i] != d.families[i - 1]]
    ticks = [(b + e - 1) / 2 for b, e in zip(bounds, [*bounds[1:], len(d.names)], strict=True)]
    ax.set_yticks(ticks, [d.families[b] for b in bounds], fontsize=7)
    for b in bounds[1:]:
        for a in (ax, ax_d):
            a.axhline(b - 0.5, color="white", lw=0.8)
    for kind, (marker, color) in MARKS.items():
        hits = [(j, i) for i, j, k in d.marks if k == kind]
        if hits:
            xs, ys = zip(*hits, strict=True)
            ax.scatter(xs, ys, marker=marker, s=18, color=color)
    pad = 0.3 / height  # colour bars below the plots, a fixed distance whatever the height
    bar = {"orientation": "horizontal", "fraction": 0.6 / height, "pad": pad}
    fig.colorbar(im, ax=ax, label="held-out accuracy", **bar)
    fig.colorbar(im_d, ax=ax_d, label="change", ticks=[-lim, lim], format="%+.2f", **bar)
    title = f"held-out accuracy, {len(d.names)} domains by family"
    ax.set_title(f"{title}\n(seesaw guard: red v regression, green ^ recovery)", fontsize=8)
    return _save(fig, plt, Path(path) if path else Path(run_dir) / "eval_heatmap.png")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir")
    ap.add_argument("--out", default=None, help="default: RUN_DIR/eval_heatmap.png")
    a = ap.parse_args(argv)
    print(heatmap_png(a.run_dir, a.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
