"""Sandbox throughput: executions/s for a mix of passing, failing and timing-out programs, and
the overhead against running the same programs with plain ``python`` (no isolation) in the same
run, with the same worker count and the same timeout.

    .venv/bin/python -m benchmarks.sandbox_throughput [--n 24] [--timeout 1.0] [--workers 0]

The sandbox runs each program in bubblewrap against a tests file (candidate and judge in two
sandboxes). The baseline runs one plain ``python`` process per program that loads the program
and calls the tests in the same interpreter: the cheapest way to get the same verdicts, and
gameable, which is why the sandbox exists. Both must give the same verdicts; the timeout is
wall time, so a program whose verdict differs is run again alone in both modes, and a difference
that was a timeout under load is counted (``load_timeouts``) rather than fatal. Prints one line
per configuration and a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

from megatron_rl.sandbox import Limits, SandboxPool
from megatron_rl.sandbox.isolation import SANDBOX_PYTHON

PASSING = "def solve(xs):\n    return sorted(xs)\n"
FAILING = "def solve(xs):\n    return list(xs)\n"
TIMING_OUT = "def solve(xs):\n    while True:\n        pass\n"
TESTS = (
    "def test_small():\n    assert solve([3, 1, 2]) == [1, 2, 3]\n\n"
    "def test_big():\n    assert solve(list(range(1000, 0, -1))) == list(range(1, 1001))\n"
)
PLAIN_RUNNER = (
    "\n\nfor _name, _fn in list(globals().items()):\n"
    "    if _name.startswith('test_') and callable(_fn):\n"
    "        _fn()\n"
)


def workload(n: int) -> list[tuple[str, str]]:
    """n programs: 45% passing, 45% failing, 10% timing out (at least one of each)."""
    n_timeout = max(1, n // 10)
    n_pass = (n - n_timeout + 1) // 2
    kinds = [("pass", PASSING)] * n_pass + [("fail", FAILING)] * (n - n_timeout - n_pass)
    return kinds + [("timeout", TIMING_OUT)] * n_timeout


def run_sandboxed(programs: list[str], workers: int, timeout_s: float) -> tuple[float, list[str]]:
    start = time.perf_counter()
    with SandboxPool(max_workers=workers, limits=Limits(timeout_s=timeout_s)) as pool:
        results = pool.map(programs, [TESTS] * len(programs))
    return time.perf_counter() - start, [r.status for r in results]


def _plain_one(program: str, directory: str, index: int, timeout_s: float) -> str:
    path = os.path.join(directory, f"p{index}.py")
    with open(path, "w") as f:
        f.write(program + "\n" + TESTS + PLAIN_RUNNER)
    try:
        proc = subprocess.run([SANDBOX_PYTHON, path], capture_output=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return "timeout"
    return "passed" if proc.returncode == 0 else "failed"


def run_plain(programs: list[str], workers: int, timeout_s: float) -> tuple[float, list[str]]:
    with tempfile.TemporaryDirectory() as d, ThreadPoolExecutor(workers) as pool:
        start = time.perf_counter()
        futures = [pool.submit(_plain_one, p, d, i, timeout_s) for i, p in enumerate(programs)]
        statuses = [f.result() for f in futures]
        return time.perf_counter() - start, statuses


def recheck(programs: list[str], plain: list[str], sandbox: list[str], timeout_s: float) -> int:
    """Programs whose verdicts differ, run again one at a time in both modes; returns how many
    differed only because a wall-clock timeout hit one of them under load (the timeout is wall
    time, so a busy machine can push a passing program past it). A difference that persists
    when each program runs alone is a real one and raises."""
    differ = [i for i, (p, s) in enumerate(zip(plain, sandbox, strict=True)) if p != s]
    for i in differ:
        _, again_plain = run_plain([programs[i]], 1, timeout_s)
        _, again_sandbox = run_sandboxed([programs[i]], 1, timeout_s)
        if again_plain != again_sandbox or "timeout" not in (plain[i], sandbox[i]):
            raise RuntimeError(
                f"verdicts differ on program {i}: plain {plain[i]} vs sandbox {sandbox[i]}, "
                f"and run alone plain {again_plain[0]} vs sandbox {again_sandbox[0]}"
            )
    return len(differ)


def measure(label: str, programs: list[str], workers: int, timeout_s: float) -> dict:
    plain_s, plain_status = run_plain(programs, workers, timeout_s)
    sandbox_s, sandbox_status = run_sandboxed(programs, workers, timeout_s)
    load_timeouts = recheck(programs, plain_status, sandbox_status, timeout_s)
    row = {
        "mix": label, "n": len(programs), "workers": workers, "load_timeouts": load_timeouts,
        "sandbox_exec_per_s": len(programs) / sandbox_s,
        "plain_exec_per_s": len(programs) / plain_s,
        "overhead_ratio": sandbox_s / plain_s,
        "sandbox_ms_per_exec_per_worker": 1000 * sandbox_s * workers / len(programs),
        "plain_ms_per_exec_per_worker": 1000 * plain_s * workers / len(programs),
    }  # fmt: skip
    print(
        f"{label:>22}: sandbox {row['sandbox_exec_per_s']:6.2f} exec/s, plain python "
        f"{row['plain_exec_per_s']:6.2f} exec/s, overhead x{row['overhead_ratio']:.2f} "
        f"({row['sandbox_ms_per_exec_per_worker']:.0f} vs {row['plain_ms_per_exec_per_worker']:.0f}"
        " ms per execution per worker)"
        + (
            f"; {load_timeouts} wall-clock timeout(s) under load, verdicts agree run alone"
            if load_timeouts
            else ""
        )
    )
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=24, help="programs in the mix")
    parser.add_argument("--timeout", type=float, default=1.0, help="timeout per program, s")
    parser.add_argument("--workers", type=int, default=0, help="parallel runs (0: cores)")
    args = parser.parse_args(argv)
    cores = os.cpu_count() or 1
    workers = args.workers or cores
    kinds = workload(args.n)
    print(f"cores={cores} workers={workers} n={args.n} timeout={args.timeout}s "
          f"mix: {sum(k == 'pass' for k, _ in kinds)} passing, "
          f"{sum(k == 'fail' for k, _ in kinds)} failing, "
          f"{sum(k == 'timeout' for k, _ in kinds)} timing out")  # fmt: skip
    rows = [
        measure("passing+failing", [p for k, p in kinds if k != "timeout"], workers, args.timeout),
        measure("with timeouts", [p for _, p in kinds], workers, args.timeout),
    ]
    print(json.dumps({"cores": cores, "python": sys.version.split()[0], "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
