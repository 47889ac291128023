"""A/B of the demo's training throughput: arms (code revision + overrides), interleaved.

Runs the pinned demo config (``benchmarks/configs/demo_cpu_2026-12-01.yaml``, the demo as it was
on 2026-12-01) for ``--steps`` steps in every arm, one after the other, round after round (A, B,
A, B, ...), on the same shipped base model. An arm is ``NAME=REV`` or ``NAME=REV:k=v,k=v``: the
code of git revision ``REV`` (``git archive`` into a temp folder, imported ahead of this tree
through ``PYTHONPATH``; ``.`` is this tree as it is) with those config overrides. Per run, over
the steps after ``--skip`` warm-up steps: *response* tokens trained (``train/response_tokens``:
the tokens the loss trains on, the same for both layouts of a step) per second of the train
phase, of the whole step and per CPU-second of this process. Packed tokens are not the measure:
shared-prefix packing holds each prompt once, so it packs fewer tokens for the same work. Ratios
against the first arm are per round, then the median over rounds.

    .venv/bin/python -m benchmarks.demo_ab [--arms main=main this=.] [--rounds 3] [--steps 12]
        [--override k=v ...] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.harness import PINNED_DEMO as PINNED
from benchmarks.harness import ROOT, read_jsonl, step_rows

MEASURES = ("train", "step", "step_cpu")  # response tokens per second of each


def export_rev(rev: str, dest: Path) -> str:
    """``git archive`` of ``rev`` into ``dest``; returns its commit hash."""
    sha = subprocess.run(["git", "rev-parse", rev], cwd=ROOT, check=True, text=True,
                         capture_output=True).stdout.strip()  # fmt: skip
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", sha], cwd=ROOT, check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    return sha


def run(tree: Path, out: Path, name: str, a: argparse.Namespace, extra: list[str]) -> dict:
    """One training run with the code in ``tree``; response tokens per second, by measure."""
    cmd = [sys.executable, "-m", "launch.cli", "train", str(PINNED),
           f"output_dir={out}", f"run_name={name}", f"train.steps={a.steps}",
           f"model.hf_path={ROOT / 'models' / 'tiny-base'}", "eval.every=0",
           "eval.samples_per_domain=8", "tracking.wandb=disabled", "tracking.progress=false",
           *a.override, *extra]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(tree), OMP_NUM_THREADS="1")
    subprocess.run(cmd, cwd=tree, env=env, check=True, stdout=subprocess.DEVNULL)
    rows = step_rows(read_jsonl(out / name / "metrics.jsonl"))[a.skip :]
    tokens = sum(r["train/response_tokens"] for r in rows)
    secs = {m: sum(r[f"time/{m}_s"] for r in rows) for m in MEASURES}
    return {"response_tokens": tokens, **{m: tokens / secs[m] for m in MEASURES},
            "packed_tokens_per_train_s": sum(r["perf/trained_tokens_per_s"] * r["perf/train_s"]
                                             for r in rows) / secs["train"]}  # fmt: skip


def parse_arm(text: str) -> tuple[str, str, list[str]]:
    """``NAME=REV[:k=v,k=v]`` -> (name, rev, overrides)."""
    name, sep, rest = text.partition("=")
    rev, _, over = rest.partition(":")
    if not sep or not name or not rev:
        raise SystemExit(f"--arms: {text!r} is not NAME=REV or NAME=REV:k=v,k=v")
    return name, rev, [o for o in over.split(",") if o]


def median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arms", nargs="+", default=["main=main", "this=."],
                   help="NAME=REV[:k=v,...]; ratios are against the first")  # fmt: skip
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds of every arm")
    p.add_argument("--steps", type=int, default=12, help="steps per run")
    p.add_argument("--skip", type=int, default=2, help="warm-up steps left out")
    p.add_argument("--override", nargs="*", default=[], help="overrides for every arm (a.b=c)")
    p.add_argument("--json", default=None, help="write the numbers here")
    a = p.parse_args()
    arms = [parse_arm(x) for x in a.arms]
    res: dict[str, Any] = {"arms": {}, "rounds": [], "steps": a.steps, "skip": a.skip}
    with tempfile.TemporaryDirectory() as tmp:
        trees = {}
        for name, rev, over in arms:
            if rev == ".":
                trees[name] = ROOT
                sha = "this tree"
            else:
                sha = export_rev(rev, Path(tmp) / name)
                trees[name] = Path(tmp) / name
            res["arms"][name] = {"rev": rev, "sha": sha, "overrides": over}
        res["load_avg_1m"] = [os.getloadavg()[0]]
        for r in range(a.rounds):
            got = {n: run(trees[n], Path(tmp) / "runs", f"{n}{r}", a, o) for n, _, o in arms}
            res["rounds"].append(got)
    res["load_avg_1m"].append(os.getloadavg()[0])
    first = arms[0][0]
    res["median_ratio"] = {
        n: {m: median([x[n][m] / x[first][m] for x in res["rounds"]]) for m in MEASURES}
        for n, _, _ in arms
    }
    report(res, first)
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=2))


def report(res: dict[str, Any], first: str) -> None:
    load = res["load_avg_1m"]
    print(f"response tokens trained per second, pinned demo config, {res['steps']} steps per run "
          f"({res['skip']} warm-up left out), load avg {load[0]:.1f} -> {load[1]:.1f}")  # fmt: skip
    for n, arm in res["arms"].items():
        print(f"  arm {n}: {arm['rev']} ({arm['sha'][:9]}) {' '.join(arm['overrides'])}")
    print(f"{'round':<6}{'arm':<10}" + "".join(f"{m + ' s':>16}" for m in MEASURES))
    for i, got in enumerate(res["rounds"]):
        for n, v in got.items():
            cells = "".join(f"{v[m]:>9.0f} {v[m] / got[first][m]:>5.2f}x" for m in MEASURES)
            print(f"{i:<6}{n:<10}{cells}")
    for n, ratios in res["median_ratio"].items():
        print(f"median vs {first}, {n}: " + ", ".join(f"{m} {v:.2f}x" for m, v in ratios.items()))


if __name__ == "__main__":
    main()
