"""Does one-step off-policy overlap (``rl.off_policy``) hurt learning on the demo?

Runs ``megatron-rl train CONFIG`` (default ``configs/demo_cpu.yaml``) with ``rl.off_policy``
false and true for each seed, interleaved (seed 1 off, seed 1 on, seed 2 off, ...), everything
else as the config sets it, and compares the held-out gains (``summary.json``'s ``mean_gain``:
after minus before on the same distinct held-out prompts) pairwise by seed:
``d_s = gain_on(s) - gain_off(s)``, mean and standard error over seeds (SD / sqrt(seeds)).
The rule the demo follows: use the overlap if ``|mean d| <= 2 SE``. Also printed: each run's
wall time and its paired per-prompt SE of the gain (the harness's ``mean_gain_stderr``).

    .venv/bin/python -m benchmarks.studies.off_policy_study [--seeds 1,2,3] [--out runs/off_policy]
        [--override k=v ...] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import DEMO_CONFIG, ROOT, train


def run(config: str, out: Path, seed: int, off_policy: bool, extra: list[str]) -> dict[str, Any]:
    """One training run; its summary plus wall time and load."""
    name = f"s{seed}_{'on' if off_policy else 'off'}"
    summary = out / name / "summary.json"
    if not summary.is_file():  # a finished run is kept: the study resumes where it stopped
        overrides = [f"output_dir={out}", f"run_name={name}", f"seed={seed}",
                     f"rl.off_policy={str(off_policy).lower()}", "checkpoint.every=0",
                     "tracking.wandb=disabled", "tracking.progress=false", *extra]  # fmt: skip
        load0, t0 = os.getloadavg()[0], time.time()
        train(config, overrides)
        meta = {"wall_s": time.time() - t0, "load_start": load0, "load_end": os.getloadavg()[0]}
        (out / name / "study_meta.json").write_text(json.dumps(meta))
    res = json.loads(summary.read_text())
    res["study"] = json.loads((out / name / "study_meta.json").read_text())
    return res


def paired(diffs: list[float]) -> tuple[float, float]:
    """Mean and standard error (SD / sqrt(n)) of paired differences."""
    n = len(diffs)
    mean = sum(diffs) / n
    var = sum((d - mean) ** 2 for d in diffs) / (n - 1) if n > 1 else float("nan")
    return mean, math.sqrt(var / n)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default=str(DEMO_CONFIG))
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--out", default=str(ROOT / "runs" / "off_policy_study"))
    p.add_argument("--override", nargs="*", default=[], help="extra config overrides (a.b=c)")
    p.add_argument("--json", default=None, help="write the numbers here")
    a = p.parse_args()
    out = Path(a.out)
    seeds = [int(s) for s in a.seeds.split(",")]
    rows = []
    for seed in seeds:
        off = run(a.config, out, seed, False, a.override)
        on = run(a.config, out, seed, True, a.override)
        rows.append(
            {"seed": seed, "off": off, "on": on, "diff": on["mean_gain"] - off["mean_gain"]}
        )
    mean, se = paired([r["diff"] for r in rows])
    print(f"{'seed':>4} {'gain off':>9} {'gain on':>9} {'on - off':>9} {'wall off':>9} "
          f"{'wall on':>8}  (per-run paired SE of the gain in brackets)")  # fmt: skip
    for r in rows:
        off, on = r["off"], r["on"]
        print(f"{r['seed']:>4} {off['mean_gain']:>+9.3f} {on['mean_gain']:>+9.3f} "
              f"{r['diff']:>+9.3f} {off['study']['wall_s']:>8.0f}s {on['study']['wall_s']:>7.0f}s"
              f"  ({off.get('mean_gain_stderr', float('nan')):.3f} / "
              f"{on.get('mean_gain_stderr', float('nan')):.3f})")  # fmt: skip
    within = abs(mean) <= 2 * se
    print(f"paired difference on - off: {mean:+.4f} +- {se:.4f} (SE over {len(seeds)} seeds); "
          f"within 2 SE: {within}")  # fmt: skip
    if a.json:
        keep = ("mean_before", "mean_after", "mean_gain", "mean_gain_stderr", "wall_s", "study")
        slim = [
            {
                "seed": r["seed"],
                "diff": r["diff"],
                **{k: {x: r[k].get(x) for x in keep} for k in ("off", "on")},
            }
            for r in rows
        ]
        Path(a.json).write_text(json.dumps(
            {"rows": slim, "diff_mean": mean, "diff_se": se, "within_2se": within,
             "config": a.config, "overrides": a.override}, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
