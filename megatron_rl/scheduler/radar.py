"""Capability radar chart: eval accuracy per domain group, at the first sweep and now.

A domain's group is its first tag, else the part of its name before the first '/', else its
tier. Each axis is the mean eval score of the group's evaluated domains. Drawn with matplotlib's
Agg backend (no display needed); the loop saves it into the run directory at every sweep and
logs it to W&B as an image.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from megatron_rl.scheduler.types import DomainInfo


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


def radar_png(
    domains: list[DomainInfo], start: np.ndarray, now: np.ndarray, path: str | Path
) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups, start_g = group_means(domains, start)
    _, now_g = group_means(domains, now)
    n = max(len(groups), 3)  # a polygon needs three axes; pad with empty ones
    labels = groups + [""] * (n - len(groups))
    angles = np.linspace(0, 2 * np.pi, n, endpoint=False)
    fig, ax = plt.subplots(figsize=(6, 6), subplot_kw={"projection": "polar"})
    for values, label, style in ((start_g, "start", "--"), (now_g, "now", "-")):
        v = np.nan_to_num(np.concatenate([values, np.zeros(n - len(groups))]))
        ax.plot(np.append(angles, angles[0]), np.append(v, v[0]), style, label=label)
        ax.fill(angles, v, alpha=0.15)
    ax.set_xticks(angles)
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_ylim(0, 1)
    ax.legend(loc="upper right", bbox_to_anchor=(1.2, 1.1))
    ax.set_title("eval accuracy per domain group")
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=80, bbox_inches="tight")
    plt.close(fig)
    return out
