"""The constructed conflicting pair alone: ``tinymix/add`` / ``tinymix/add_last_digit``.

Same question, conflicting answer conventions on sums >= 10 (domains/tiny_mix.py). In the
12-domain benchmark (scheduler_real.py) the pair's held-out curves move together (their
sweep-to-sweep changes correlate at +0.5), so this looks at the pair alone, from the shipped base
model with the demo's RL settings, one seed (a demonstration, not an A/B):

* ``train add_last_digit only`` / ``train add only``: a static mix giving the partner no groups;
  both domains are evaluated. Does training one convention un-learn the other?
* ``adaptive`` / ``adaptive, no seesaw guard``: the benchmark's adaptive settings on the pair;
  the two runs are identical until the guard first acts.

Writes ``benchmarks/scheduler_pair.json`` (per arm, scheduler_real's ``score_run``: start /
final / best held-out accuracy per domain and the curves, the guard's events, wall time) and
``benchmarks/scheduler_pair.png`` (per domain: greedy held-out accuracy, solid, and the sampled
training reward at T, dotted, one colour per arm), both from the runs' own files
(``--redraw`` re-reads finished runs without training):

    .venv/bin/python benchmarks/scheduler_pair.py [--seed 1] [--steps 150] [--redraw]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from scheduler_real import ADAPTIVE, BUDGET, Arms, run_one, score_run, slug  # noqa: E402

PAIR = ["tinymix/add", "tinymix/add_last_digit"]


def only(domain: str) -> list[str]:
    """A static mix: every trained group from ``domain``, none from its partner."""
    weights = {d: float(d == domain) for d in PAIR}
    return [*BUDGET, "scheduler.policy=static", f"scheduler.weights={json.dumps(weights)}"]


ARMS: Arms = {
    "train add_last_digit only": only("tinymix/add_last_digit"),
    "train add only": only("tinymix/add"),
    "adaptive": ADAPTIVE,
    "adaptive, no seesaw guard": [*ADAPTIVE, "scheduler.seesaw=false"],
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=1, help="one seed (a demonstration, not an A/B)")
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--eval-every", type=int, default=25)
    ap.add_argument("--eval-n", type=int, default=128, help="held-out tasks per domain")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--wandb", default="auto", choices=["auto", "online", "offline", "disabled"])
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "scheduler_pair.json"))
    ap.add_argument("--png", default=str(ROOT / "benchmarks" / "scheduler_pair.png"))
    ap.add_argument("--run-dir", default=str(ROOT / "runs" / "bench_pair"))
    ap.add_argument("--redraw", action="store_true", help="summarize finished runs, no training")
    a = ap.parse_args(argv)
    run_dir = Path(a.run_dir)
    opts = argparse.Namespace(
        model=str(ROOT / "models" / "tiny-base"), domains=PAIR, steps=a.steps, prompts=16,
        group=8, eval_every=a.eval_every, eval_n=a.eval_n, wandb=a.wandb,
    )  # fmt: skip
    t0 = time.time()
    if a.redraw:
        dirs = [run_dir / f"{slug(arm)}-s{a.seed}" for arm in ARMS]
    else:
        with ThreadPoolExecutor(max_workers=a.jobs) as pool:
            dirs = list(pool.map(lambda arm: run_one(arm, a.seed, opts, run_dir, ARMS), ARMS))
    results = {arm: score_run(d, opts.group) for arm, d in zip(ARMS, dirs, strict=True)}
    for arm, r in results.items():
        cells = "  ".join(
            f"{d}: {r['start'][d]:.3f} -> {r['final'][d]:.3f} (best {r['best'][d]:.3f})"
            for d in PAIR
        )
        print(f"{arm:28s} {cells}  events {len(r['seesaw_events'])}")
    doc = {"seed": a.seed, "steps": a.steps, "eval_tasks_per_domain": a.eval_n, "arms": ARMS}
    wall = sum(r["wall_s"] for r in results.values()) if a.redraw else time.time() - t0
    doc |= {"wall_s_total": round(wall, 1), "results": results}
    Path(a.out).write_text(json.dumps(doc, indent=1))
    png = draw_pair(results, Path(a.png))
    print(f"wrote {a.out} and {png}")
    return 0


def draw_pair(results: dict[str, Any], path: Path) -> Path:
    from megatron_rl.scheduler.curves import _plt, _save, read_jsonl, series

    plt = _plt()
    fig, axes = plt.subplots(1, len(PAIR), figsize=(6 * len(PAIR), 4.5), sharey=True)
    colors = plt.get_cmap("tab10")
    for i, (arm, r) in enumerate(results.items()):
        rows = read_jsonl(Path(r["run_dir"]) / "metrics.jsonl")
        for ax, d in zip(axes, PAIR, strict=True):
            ax.plot(*zip(*r["curves"][d], strict=True), "-o", ms=3, color=colors(i), label=arm)
            if pts := series(rows, f"rollout/{d}/reward_mean"):
                xs, ys = zip(*pts, strict=True)
                smooth = [np.mean(ys[max(0, j - 9) : j + 1]) for j in range(len(ys))]  # 10 steps
                ax.plot(xs, smooth, ":", lw=1.2, color=colors(i))
    for ax, d in zip(axes, PAIR, strict=True):
        ax.set_title(d)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("accuracy / mean reward")
    axes[0].legend(fontsize=8)
    fig.suptitle("greedy held-out accuracy (solid), sampled training reward (dotted, 10-step mean)")
    return _save(fig, plt, path)


if __name__ == "__main__":
    sys.exit(main())
