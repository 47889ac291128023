"""Sandbox throughput of this tree against another git revision's sandbox, interleaved in one run.

    .venv/bin/python -m benchmarks.sandbox_ab [--base main] [--rounds 6] [--n 24] [--timeout 1.0]

The overhead of the sandbox over plain python moves a lot between runs on a shared machine, so
two separate runs of sandbox_throughput.py cannot tell a 5% change. This runs the same workload
(sandbox_throughput.workload: passing, failing and timing-out programs, each against a 2-test
file) through the base revision's ``megatron_rl/sandbox`` (``megatron_rl/rewards/sandbox`` before
issue 53; extracted with ``git archive`` and imported under another name) and through this
tree's, alternating A-B, B-A each round so a drift in load hits both alike. Prints executions/s
per round and the ratio new/base per round, their geometric mean and a 95% interval (t over the
log ratios), the same for CPU seconds per execution (host and sandboxes; steadier than wall time
under load), then one JSON line. Verdicts that differ between the sides (a program near its 1 s
limit timing out on one side under heavy load) are counted per round, not hidden.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path

from benchmarks.harness import ROOT
from benchmarks.sandbox_throughput import TESTS, workload

# where the sandbox package lives in a revision: now, and before issue 53 moved it out of rewards/
SANDBOX_PATHS = ("megatron_rl/sandbox", "megatron_rl/rewards/sandbox")
T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26}


def load_base(ref: str, into: Path):
    """The sandbox package at git revision ``ref``, importable as ``sandbox_base``."""
    for where in SANDBOX_PATHS:
        got = subprocess.run(["git", "-C", str(ROOT), "archive", ref, where], capture_output=True)
        if got.returncode == 0:
            break
    else:
        raise ValueError(f"revision {ref!r} has no sandbox package at {' or '.join(SANDBOX_PATHS)}")
    with tarfile.open(fileobj=BytesIO(got.stdout)) as archive:
        archive.extractall(into, filter="data")
    package = into / "sandbox_base"
    shutil.move(into / where, package)
    for path in package.glob("*.py"):  # the harness under inside/ imports nothing of ours
        text = re.sub(r"\bmegatron_rl\.(rewards\.)?sandbox\b", "sandbox_base", path.read_text())
        path.write_text(text)
    for path in [into, *into.rglob("*")]:  # the sandbox's unprivileged uid reads inside/
        path.chmod(0o755 if path.is_dir() else 0o644)
    spec = importlib.util.spec_from_file_location(
        "sandbox_base", package / "__init__.py", submodule_search_locations=[str(package)]
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["sandbox_base"] = module  # its own modules import sandbox_base.*
    spec.loader.exec_module(module)
    return module


def _cpu_s() -> float:
    """CPU seconds of this process and of every child it has reaped (bwrap waits for the
    sandbox's processes, so theirs are included)."""
    own, kids = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def timed(
    package, programs: list[str], workers: int, timeout_s: float
) -> tuple[float, float, list]:
    """Wall seconds, CPU seconds and verdicts of one pass over ``programs``."""
    start, cpu = time.perf_counter(), _cpu_s()
    with package.SandboxPool(max_workers=workers, limits=package.Limits(timeout_s=timeout_s)) as p:
        statuses = [r.status for r in p.map(programs, [TESTS] * len(programs))]
    return time.perf_counter() - start, _cpu_s() - cpu, statuses


def interval(ratios: list[float]) -> tuple[float, float, float]:
    """Geometric mean of the ratios and a 95% t interval on the log scale."""
    logs = [math.log(r) for r in ratios]
    mean = statistics.fmean(logs)
    if len(logs) < 2:
        return math.exp(mean), float("nan"), float("nan")
    half = T95.get(len(logs) - 1, 2.0) * statistics.stdev(logs) / math.sqrt(len(logs))
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="main", help="git revision to compare against")
    parser.add_argument("--rounds", type=int, default=6, help="A-B pairs (order alternates)")
    parser.add_argument("--n", type=int, default=24, help="programs per round and side")
    parser.add_argument("--timeout", type=float, default=1.0, help="timeout per program, s")
    parser.add_argument("--workers", type=int, default=0, help="parallel runs (0: cores)")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        raise ValueError(f"--rounds must be >= 1, got {args.rounds}")
    workers = args.workers or os.cpu_count() or 1
    programs = [p for _, p in workload(args.n)]
    import megatron_rl.sandbox as new

    with tempfile.TemporaryDirectory(prefix="mrl-sandbox-ab-") as tmp:
        os.chmod(tmp, 0o755)
        sides = {"base": load_base(args.base, Path(tmp)), "new": new}
        timed(sides["base"], programs[:2], workers, args.timeout)  # warm both up once
        timed(sides["new"], programs[:2], workers, args.timeout)
        rows = []
        for i in range(args.rounds):
            order = ["base", "new"] if i % 2 == 0 else ["new", "base"]
            secs, cpu, statuses = {}, {}, {}
            for side in order:
                secs[side], cpu[side], statuses[side] = timed(
                    sides[side], programs, workers, args.timeout
                )
            rows.append({side: len(programs) / s for side, s in secs.items()})
            rows[-1].update({f"{side}_cpu_ms": 1000 * c / len(programs) for side, c in cpu.items()})
            # under heavy load a program near the 1 s limit may time out on one side only
            rows[-1]["verdicts_differ"] = sum(map(str.__ne__, statuses["base"], statuses["new"]))
            if any(s not in ("passed", "failed", "timeout") for s in statuses["new"]):
                raise RuntimeError(f"unexpected verdicts: {statuses}")
            print(f"round {i}: base {rows[-1]['base']:.2f} exec/s, new {rows[-1]['new']:.2f} "
                  f"exec/s, new/base {rows[-1]['new'] / rows[-1]['base']:.3f}; CPU ms/exec base "
                  f"{rows[-1]['base_cpu_ms']:.0f} new {rows[-1]['new_cpu_ms']:.0f}; "
                  f"{rows[-1]['verdicts_differ']} verdicts differ")  # fmt: skip
    mean, low, high = interval([r["new"] / r["base"] for r in rows])
    cpu_mean, cpu_low, cpu_high = interval([r["new_cpu_ms"] / r["base_cpu_ms"] for r in rows])
    print(f"throughput new/base: {mean:.3f} (95% CI {low:.3f}-{high:.3f}); CPU per execution "
          f"new/base: {cpu_mean:.3f} ({cpu_low:.3f}-{cpu_high:.3f}); {args.rounds} rounds of "
          f"{len(programs)} programs, {workers} workers, base={args.base}")  # fmt: skip
    print(json.dumps({"base": args.base, "workers": workers, "n": len(programs), "rounds": rows,
                      "ratio": mean, "ci95": [low, high], "cpu_ratio": cpu_mean,
                      "cpu_ci95": [cpu_low, cpu_high]}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
