"""Turning what the host collected from the sandboxes into one ExecResult.

Only two things can make an execution ``passed``: (no tests) the candidate process's exit
status 0, as reported by the kernel to the host; (with tests) a complete verdict stream from the
judge (every test ``ok`` and a final ``done`` line) and a judge exit status 0. Text the candidate
prints is used only to tell the failure statuses apart (``oom`` when it shows a MemoryError),
never to grant a pass.
"""

from __future__ import annotations

import json
import signal
from dataclasses import dataclass, field

from megatron_rl.sandbox.result import ExecResult

TEXT_LIMIT = 10_000  # characters of stdout/stderr kept in the result
COMPILE_ERROR_EXIT = 3  # child.py's exit status for a program that does not compile
_TIME_SIGNALS = (signal.SIGXCPU,)


@dataclass
class Collected:
    """Raw observations of one execution, all gathered by the host."""

    deadline: float = 0.0  # time.monotonic() at which the execution is killed
    timed_out: bool = False  # the wall-time deadline passed
    output_exceeded: bool = False  # stdout + stderr went over the limit
    verdict: bytes = b""  # the judge's verdict stream
    exit_codes: list[int | None] = field(default_factory=list)  # [candidate, judge?]
    stdout: bytes = b""  # candidate's stdout
    stderr: bytes = b""  # candidate's stderr
    judge_stderr: bytes = b""  # judge's stderr (tests that failed to import, harness bugs)
    oom_killed: bool = False  # the kernel killed a candidate process at its cgroup's memory limit


def _text(data: bytes) -> str:
    text = data.decode("utf-8", errors="replace")
    return text if len(text) <= TEXT_LIMIT else text[:TEXT_LIMIT] + "\n...[truncated]"


def _signal_of(code: int | None) -> int | None:
    """The signal that ended a process: Popen reports -N, bwrap reports 128+N."""
    if code is None:
        return None
    if code < 0:
        return -code
    return code - 128 if 128 < code < 160 else None


def _parse_verdict(data: bytes) -> tuple[list[dict], dict | None]:
    records: list[dict] = []
    done = None
    for line in data.decode("utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            return records, None
        if record.get("done"):
            done = record
        else:
            records.append(record)
    return records, done


def _failure_status(got: Collected, failures: list[str]) -> str:
    if "MemoryError" in got.stderr.decode(errors="replace")[-4000:] or any(
        "MemoryError" in f for f in failures
    ):
        return "oom"
    sig = _signal_of(got.exit_codes[0] if got.exit_codes else None)
    if sig in _TIME_SIGNALS:
        return "timeout"
    if sig is not None:
        return "killed"
    return "failed"


def _script_status(got: Collected) -> tuple[str, str]:
    code = got.exit_codes[0]
    if code == 0:
        return "passed", ""
    if code == COMPILE_ERROR_EXIT and "Error" in got.stderr.decode(errors="replace")[-2000:]:
        return "error", "the program does not compile"
    return _failure_status(got, []), f"exit status {code}"


def _tests_status(got: Collected, res: ExecResult) -> tuple[str, str]:
    records, done = _parse_verdict(got.verdict)
    res.tests_passed = sum(1 for r in records if r.get("ok") is True)
    res.failures = [
        f"{r.get('test')}: {r.get('error')}" for r in records if r.get("ok") is not True
    ]
    if done is None or got.exit_codes[1] != 0:
        detail = _text(got.judge_stderr)[-500:]
        return "error", f"the judge gave no complete verdict (exit {got.exit_codes[1]}): {detail}"
    res.tests_total = int(done.get("total", 0))
    if done.get("load_error") and _script_status(got)[0] == "error":
        return "error", f"the program does not compile: {_text(got.stderr).strip()[-300:]}"
    if done.get("load_error"):
        status = "oom" if "MemoryError" in str(done["load_error"]) else "error"
        return status, f"program did not load: {done['load_error']}"
    if res.tests_total == 0:
        return "error", "the tests file defines no test_* functions"
    if len(records) == res.tests_total and res.tests_passed == res.tests_total:
        return "passed", ""
    return _failure_status(got, res.failures), res.failures[0] if res.failures else "incomplete"


def classify(got: Collected, with_tests: bool, duration_s: float, sandboxed: bool) -> ExecResult:
    """The ExecResult for one execution; see the module docstring for what can pass."""
    res = ExecResult(
        status="error",
        exit_code=got.exit_codes[0] if got.exit_codes else None,
        duration_s=duration_s,
        stdout=_text(got.stdout),
        stderr=_text(got.stderr),
        sandboxed=sandboxed,
    )
    if with_tests:
        status, reason = _tests_status(got, res)
    else:
        status, reason = _script_status(got)
    if got.timed_out:
        status, reason = "timeout", "wall-time limit reached"
    elif got.output_exceeded:
        status, reason = "killed", "output limit exceeded"
    elif got.oom_killed and status != "passed":
        status, reason = "oom", "the sandbox's memory limit was reached (memory cgroup)"
    res.status, res.reason = status, reason
    return res
