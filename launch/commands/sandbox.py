"""``megatron-rl sandbox run PROGRAM.py [--tests T.py] [--timeout S] [--memory-mb M] --json``.

Runs one program in the code-reward sandbox, exactly as the code domains' verifier does, and
prints the result: one JSON object with ``--json``, a short summary otherwise. The exit status is
0 when the status is ``passed``, 1 otherwise (2 for bad arguments), so it composes in scripts.
"""

from __future__ import annotations

import argparse
import json
import os

from megatron_rl.sandbox import Limits, SandboxUnavailable, run_program

HELP = "run a program (optionally against a tests file) in the code-reward sandbox"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    run = sub.add_parser("run", help="run PROGRAM.py in the sandbox and report its verdict")
    run.add_argument("program", help="Python file to run (the candidate program)")
    run.add_argument("--tests", help="Python file of test_* functions run against the program")
    run.add_argument("--timeout", type=float, default=10.0, help="wall-time limit, seconds")
    run.add_argument(
        "--memory-mb",
        type=int,
        default=512,
        help="memory limit per process, and per sandbox where a memory cgroup is available, MiB",
    )
    run.add_argument("--json", action="store_true", help="print one JSON object")
    run.add_argument(
        "--allow-unsandboxed",
        action="store_true",
        help="if bubblewrap cannot run, run the program WITHOUT isolation (dangerous)",
    )


def _read(path: str, what: str) -> str:
    if not os.path.isfile(path):
        raise ValueError(f"{what} file {path!r} does not exist (give a path to a .py file)")
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def main(args: argparse.Namespace) -> int:
    program = _read(args.program, "program")
    tests = _read(args.tests, "tests") if args.tests else None
    limits = Limits(timeout_s=args.timeout, memory_mb=args.memory_mb)
    try:
        res = run_program(program, tests, allow_unsandboxed=args.allow_unsandboxed, limits=limits)
    except SandboxUnavailable as e:
        raise ValueError(str(e)) from None
    if args.json:
        print(json.dumps(res.to_dict()))
    else:
        tests_part = f", tests {res.tests_passed}/{res.tests_total}" if tests is not None else ""
        print(f"{res.status} (exit {res.exit_code}, {res.duration_s:.2f} s{tests_part})")
        if res.reason:
            print(f"reason: {res.reason}")
    return 0 if res.passed else 1
