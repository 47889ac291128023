"""Capability radar: eval accuracy per domain group (or per domain), first sweep vs now.

A domain's group is its first tag, else the part of its name before the first '/', else its
tier. Each axis is the mean eval score of the group's evaluated domains. When grouping would
leave fewer than ``MIN_GROUP_AXES`` axes (e.g. the demo: every domain is tagged ``tiny``), the
chart has one axis per evaluated domain instead, so it says something per domain. Start is a
dashed black line with large hollow round markers drawn on top of now (solid blue, squares), so
both stay visible where they coincide. Drawn with matplotlib's Agg backend (no display needed);
the loop saves it into the run directory at every sweep and logs it to W&B as an image.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from megatron_rl.scheduler.types import DomainInfo

MIN_GROUP_AXES = 3  # fewer groups than this: one axis per domain


def domain_group(d: DomainInfo) -> str:
    if d.tags:
        return d.tags[0]
    return d.name.split("/", 1)[0] if "/" in d.name else d.tier


def group_means(domains: list[DomainInfo], values: np.ndarray) -> tuple[list[str], np.ndarray]:
    """Group names (sorted) and the nan-mean of ``values`` [n_domains] per group."""
    groups = sorted({domain_group(d) for d in domains})
    keys = np.array([groups.index(domain_group(d)) for d in domains])
    means = np.full(len(groups), np.nan)
    for k in range(len(groups)):
        v = values[(keys == k) & ~np.isnan(values)]
        if v.size:
            means[k] = v.mean()
    return groups, means


@dataclass
class RadarData:
    """What the radar draws: one label and a start and a now value per axis (NaN: no eval)."""

    mode: str  # 'group' (an axis per domain group) or 'domain' (an axis per domain)
    labels: list[str]  # axis labels, in drawing order
    start: np.ndarray  # [n_axes] eval mean at the first sweep
    now: np.ndarray  # [n_axes] eval mean at the latest sweep


def radar_data(domains: list[DomainInfo], start: np.ndarray, now: np.ndarray) -> RadarData:
    """Axes and values: by group when that gives >= MIN_GROUP_AXES axes, else by domain."""
    groups, start_g = group_means(domains, start)
    _, now_g = group_means(domains, now)
    evaluated = ~(np.isnan(start_g) & np.isnan(now_g))
    if evaluated.sum() >= MIN_GROUP_AXES:
        g = np.flatnonzero(evaluated)
        return RadarData("group", [groups[i] for i in g], start_g[g], now_g[g])
    keep = [i for i in range(len(domains)) if not (np.isnan(start[i]) and np.isnan(now[i]))]
    keep = keep or list(range(len(domains)))
    labels = [_short(domains[i].name) for i in keep]
    return RadarData("domain", labels, np.asarray(start)[keep], np.asarray(now)[keep])


def _short(name: str) -> str:
    """A domain name without its family prefix, for an axis label."""
    return name.split("/", 1)[1] if "/" in name else name


def radar_png(
    domains: list[DomainInfo], start: np.ndarray, now: np.ndarray, path: str | Path
) -> Path:
    """The run's radar: first sweep (dashed, round markers) vs now (solid, squares)."""
    data = radar_data(domains, np.asarray(start, float), np.asarray(now, float))
    per = "domain" if data.mode == "domain" else "domain group"
    lines = {"start (first sweep)": data.start, "now": data.now}
    return draw_radar(data.labels, lines, path, f"held-out accuracy per {per}: first sweep vs now")


# line styles in drawing order; the first (the reference: start, or a baseline) is dashed with
# large hollow markers drawn on top, so it stays visible where it coincides with a later line
STYLES: tuple[dict[str, Any], ...] = (
    {"ls": "--", "marker": "o", "color": "black", "lw": 1.2, "ms": 9, "mfc": "none", "zorder": 4},
    {"ls": "-", "marker": "s", "color": "tab:blue", "lw": 2.5, "ms": 5},
    {"ls": "-", "marker": "^", "color": "tab:orange", "lw": 1.5, "ms": 5},
    {"ls": "-", "marker": "D", "color": "tab:green", "lw": 1.5, "ms": 5},
    {"ls": "-", "marker": "v", "color": "tab:red", "lw": 1.5, "ms": 5},
    {"ls": "-", "marker": "P", "color": "tab:purple", "lw": 1.5, "ms": 5},
)


def draw_radar(
    labels: list[str], lines: dict[str, np.ndarray], path: str | Path, title: str
) -> Path:
    """A polar chart with one closed line per entry of ``lines`` (values in [0, 1], NaN as 0)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    k = len(labels)
    n = max(k, 3)  # a polygon needs three axes; pad with empty ones
    angles = np.linspace(0, 2 * np.pi, n, endpoint=False)
    closed = np.append(angles, angles[0])
    fig, ax = plt.subplots(figsize=(7, 7), subplot_kw={"projection": "polar"})
    for j, (label, values) in enumerate(lines.items()):
        style = STYLES[j % len(STYLES)]
        v = np.nan_to_num(np.concatenate([np.asarray(values, float), np.zeros(n - k)]))
        ax.plot(closed, np.append(v, v[0]), label=label, **style)
        ax.fill(angles, v, alpha=0.08, color=style["color"])
    ax.set_xticks(angles)
    ax.set_xticklabels(labels + [""] * (n - k), fontsize=8)
    ax.set_ylim(0, 1.05)
    ax.legend(loc="upper right", bbox_to_anchor=(1.3, 1.12), fontsize=8)
    ax.set_title(title)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=80, bbox_inches="tight")
    plt.close(fig)
    return out
