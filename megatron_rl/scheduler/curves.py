"""Per-domain held-out curves of a run, drawn from its own ``metrics.jsonl`` and ``events.jsonl``.

``eval_curves.png``: accuracy against step, one line per domain (``eval/<domain>/accuracy`` at
each sweep), the seesaw guard's ``regression`` events marked with a downward triangle on the
domain's line (``recovery`` with an upward one). ``seesaw_png``: one domain's story in three
panels (its eval curve with the events, its share of the mix, its sampling temperature), from
the ``sched/<domain>/weight`` and ``sched/<domain>/temperature`` metrics; the picture of
docs/scheduler_seesaw.png. Both read only the run directory, so they also redraw finished runs:

    python -m megatron_rl.scheduler.curves RUN_DIR --seesaw docs/scheduler_seesaw.png
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from megatron_rl.durable import jsonl_rows

MARKS = {"regression": ("v", "tab:red"), "recovery": ("^", "tab:green")}
MAX_LEGEND = 30  # more domains than this: grey lines, no legend, and the mean drawn bold


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Rows of a JSONL file ([] when it does not exist; a torn last line, what a kill during a
    run's append leaves, is dropped with a warning: :func:`megatron_rl.durable.jsonl_rows`)."""
    return [row for _, row in jsonl_rows(path)]


def series(rows: list[dict[str, Any]], key: str) -> list[tuple[int, float]]:
    """``(step, value)`` for every row holding a numeric ``key``; a later row wins a step."""
    out: dict[int, float] = {}
    for r in rows:
        v = r.get(key)
        if isinstance(v, int | float) and not isinstance(v, bool):
            out[int(r["step"])] = float(v)
    return sorted(out.items())


@dataclass
class CurveData:
    """What ``eval_curves.png`` draws."""

    curves: dict[str, list[tuple[int, float]]] = field(default_factory=dict)  # domain -> points
    marks: list[tuple[int, str, str, float]] = field(default_factory=list)  # step, domain, kind, y


def curve_data(run_dir: str | Path) -> CurveData:
    """Eval points per domain and the seesaw events placed on them, from a run directory."""
    run = Path(run_dir)
    rows = read_jsonl(run / "metrics.jsonl")
    names = sorted(
        {k[len("eval/") : -len("/accuracy")] for r in rows for k in r if _is_eval_key(k)}
    )
    data = CurveData({n: series(rows, f"eval/{n}/accuracy") for n in names})
    for e in read_jsonl(run / "events.jsonl"):
        kind, domain = e.get("event"), e.get("domain")
        if kind in MARKS and domain in data.curves:
            y = e.get("score", _value_at(data.curves[domain], int(e["step"])))
            data.marks.append((int(e["step"]), str(domain), str(kind), float(y)))
    return data


def _is_eval_key(key: str) -> bool:
    """A domain's held-out accuracy (not one of its per-level accuracies)."""
    if not (key.startswith("eval/") and key.endswith("/accuracy") and key.count("/") >= 2):
        return False
    return re.search(r"/level\d+/accuracy$", key) is None


def _value_at(points: list[tuple[int, float]], step: int) -> float:
    """The curve's value at ``step`` (the last point at or before it; the first one otherwise)."""
    before = [v for s, v in points if s <= step]
    return before[-1] if before else (points[0][1] if points else float("nan"))


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def curves_png(run_dir: str | Path, path: str | Path | None = None) -> Path:
    """Draw ``eval_curves.png`` (default: into the run directory); returns its path."""
    plt = _plt()
    data = curve_data(run_dir)
    fig, ax = plt.subplots(figsize=(9, 5))
    colors = plt.get_cmap("tab10")
    many = len(data.curves) > MAX_LEGEND  # hundreds of domains: thin grey lines and their mean
    for i, (name, pts) in enumerate(data.curves.items()):
        if pts and many:
            ax.plot(*zip(*pts, strict=True), lw=0.6, alpha=0.35, color="grey")
        elif pts:  # 10 colours, then the same colours dashed, then dotted
            steps, acc = zip(*pts, strict=True)
            ls = ("-", "--", ":")[(i // 10) % 3]
            ax.plot(steps, acc, ls=ls, marker="o", ms=3, lw=1.5, color=colors(i % 10), label=name)
    if many:
        mean = series(read_jsonl(Path(run_dir) / "metrics.jsonl"), "eval/mean_accuracy")
        if mean:
            steps, acc = zip(*mean, strict=True)
            label = f"mean of {len(data.curves)} domains (grey: each; eval_heatmap.png)"
            ax.plot(steps, acc, marker="o", lw=2.5, color="tab:blue", label=label)
    for kind, (marker, color) in MARKS.items():
        hits = [(s, y) for s, _, k, y in data.marks if k == kind]
        if hits:
            xs, ys = zip(*hits, strict=True)
            ax.scatter(xs, ys, marker=marker, s=90, color=color, zorder=5, label=f"seesaw {kind}")
    ax.set_xlabel("step")
    ax.set_ylabel("held-out accuracy")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.set_title("held-out accuracy per domain")
    if data.curves:
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    return _save(fig, plt, Path(path) if path else Path(run_dir) / "eval_curves.png")


def _save(fig: Any, plt: Any, out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=80, bbox_inches="tight")
    plt.close(fig)
    return out


def seesaw_png(
    run_dir: str | Path,
    domain: str,
    path: str | Path,
    compare: tuple[str | Path, ...] = (),
    partner: str | None = None,
) -> Path:
    """One domain's eval curve with its seesaw events, its mix share and its temperature.
    ``compare``: other runs (e.g. the same seed without the guard) drawn dashed in every panel;
    ``partner``: a second domain of this run (e.g. the one it interferes with), dotted on top."""
    plt = _plt()
    run = Path(run_dir)
    rows = read_jsonl(run / "metrics.jsonl")
    data = curve_data(run)
    for d in (domain, partner):
        if d is not None and d not in data.curves:
            raise ValueError(f"domain {d!r} has no eval curve in {run}/metrics.jsonl")
    others = [(Path(c).name, read_jsonl(Path(c) / "metrics.jsonl")) for c in compare]
    fig, axes = plt.subplots(3, 1, figsize=(8, 7), sharex=True)
    panels = (
        (f"eval/{domain}/accuracy", "held-out accuracy"),
        (f"sched/{domain}/weight", "share of the mix"),
        (f"sched/{domain}/temperature", "temperature"),
    )
    for ax, (key, label) in zip(axes, panels, strict=True):
        mark = "o" if "eval" in key else None
        pts = series(rows, key)
        if pts:
            ax.plot(*zip(*pts, strict=True), "-", lw=1.5, marker=mark, label=f"{run.name}")
        for name, other in others:
            if pts := series(other, key):
                ax.plot(*zip(*pts, strict=True), "--", lw=1.2, marker=mark, ms=3, label=name)
        if partner and ax is axes[0]:
            pts = series(rows, f"eval/{partner}/accuracy")
            ax.plot(*zip(*pts, strict=True), ":", lw=1.2, marker="s", ms=3, label=partner)
        if others or (partner and ax is axes[0]):
            ax.legend(fontsize=7)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        for step, d, kind, y in data.marks:
            if d == domain:
                ax.axvline(step, color=MARKS[kind][1], ls=":", lw=1.5)
                if ax is axes[0]:
                    ax.scatter([step], [y], marker=MARKS[kind][0], s=90, color=MARKS[kind][1])
    axes[0].set_title(f"{domain}: seesaw guard events (red: regression, green: recovery)")
    axes[-1].set_xlabel("step")
    return _save(fig, plt, Path(path))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="redraw a run's eval curves (and a seesaw panel)")
    ap.add_argument("run_dir")
    ap.add_argument("--seesaw", default=None, help="also draw the seesaw panel to this path")
    ap.add_argument("--domain", default=None, help="its domain (default: first regression)")
    ap.add_argument("--compare", nargs="*", default=[], help="other runs to draw dashed")
    ap.add_argument("--partner", default=None, help="a second domain of the run, dotted")
    a = ap.parse_args(argv)
    print(curves_png(a.run_dir))
    if a.seesaw:
        domain = a.domain
        if domain is None:
            hits = [m for m in curve_data(a.run_dir).marks if m[2] == "regression"]
            if not hits:
                raise SystemExit(f"no regression event in {a.run_dir}/events.jsonl; pass --domain")
            domain = hits[0][1]
        print(seesaw_png(a.run_dir, domain, a.seesaw, tuple(a.compare), a.partner))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
