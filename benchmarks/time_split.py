"""Time split of an RL step: the share spent generating, scoring, training, syncing, evaluating.

Reads ``metrics.jsonl`` of a run (``--metrics RUN/metrics.jsonl``), or, without it, runs a short
``megatron-rl train configs/demo_cpu.yaml`` itself (``--steps`` steps, the demo's batch: 16
prompts x n=8 x <= 24 tokens; model ``models/tiny-base`` when present, else a random ``3m``
Qwen2) and reads that. The loop times each phase per step (``time/<phase>_s``) and reports the
rest of the step as ``time/other_s``: bookkeeping, advantages, logging, checkpoints and any idle
wait, so "other" is the idle/overhead share. Mid-run evals are off in the short run (the demo
evaluates every 20 steps); a given run's evals are counted as they happened.

Shares are over the sum of ``time/step_s`` of all logged steps; the largest share is the next
optimisation target.

    .venv/bin/python -m benchmarks.time_split [--metrics PATH | --steps 4] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from benchmarks.harness import DEMO_CONFIG, OUT, ROOT, read_jsonl, train
from benchmarks.harness import PHASES as STEP_PHASES

PHASES = tuple(p for p in STEP_PHASES if p not in ("log", "checkpoint"))  # the split's phases


def split(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Seconds and share per phase over the step rows of a metrics.jsonl (``time/step_s``)."""
    rows = [r for r in rows if "time/step_s" in r]
    if not rows:
        raise ValueError("no step rows (with time/step_s) in the metrics file")
    total = sum(r["time/step_s"] for r in rows)
    seconds = {p: sum(r.get(f"time/{p}_s", 0.0) for r in rows) for p in PHASES}
    return {
        "steps": len(rows),
        "step_s": total / len(rows),
        "seconds": seconds,
        "share": {p: s / total for p, s in seconds.items()},
        "largest": max(seconds, key=lambda p: seconds[p]),
    }


def run_demo(a: argparse.Namespace, out: Path) -> Path:
    """A short demo-config run; returns its metrics.jsonl."""
    model = ROOT / "models" / "tiny-base"
    if a.size or not (model / "config.json").is_file():
        from benchmarks.tiny_model import make_tiny_qwen2

        model = make_tiny_qwen2(out / "model", a.size or "3m", seed=0, init_std=0.02)
    overrides = [
        f"output_dir={out}",
        "run_name=time_split",
        f"model.hf_path={model}",
        f"train.steps={a.steps}",
        f"train.threads={a.threads}",
        "eval.every=0",
        "eval.samples_per_domain=8",
        "checkpoint.every=0",
        "tracking.wandb=disabled",
        "tracking.progress=false",
        *a.override,
        "--overwrite",  # a fresh run each time, over the last one's
    ]
    train(DEMO_CONFIG, overrides)
    return out / "time_split" / "metrics.jsonl"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--metrics", default=None, help="metrics.jsonl of a run (else run one)")
    p.add_argument("--steps", type=int, default=4, help="steps of the short demo run")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads of the run")
    p.add_argument("--size", default="", help="random tiny_model size instead of tiny-base")
    p.add_argument("--override", nargs="*", default=[], help="extra config overrides (a.b=c)")
    p.add_argument("--out", default=str(OUT), help="where the short run is kept")
    p.add_argument("--json", default=None, help="write the numbers here")
    a = p.parse_args()
    path = Path(a.metrics) if a.metrics else run_demo(a, Path(a.out))
    rows = read_jsonl(path)
    res = dict(split(rows), metrics_path=str(path), cores=os.cpu_count())
    res["load_avg_1m"] = os.getloadavg()[0]
    print(
        f"time split over {res['steps']} steps of {path} (mean step {res['step_s']:.2f} s), "
        f"cores={res['cores']} load_avg_1m={res['load_avg_1m']:.1f}"
    )
    for ph in PHASES:
        print(f"  {ph:<9}{res['seconds'][ph]:>9.2f} s {res['share'][ph]:>8.1%}")
    print(f"largest share: {res['largest']}")
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
