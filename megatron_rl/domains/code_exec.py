"""Run a candidate program against hidden tests: the one adapter between domains and the sandbox.

Code domains call :func:`run_tests` only. It uses ``megatron_rl.rewards.sandbox.run_program``
(bubblewrap isolation, verdicts the candidate cannot forge; see ``docs/sandbox.md``). If that
package cannot be imported it falls back to :func:`run_program_subprocess` below, a plain
``python -I`` subprocess with a wall-clock timeout and an address-space limit, which is **not** a
security boundary (the candidate runs as this user and could forge its verdict) and logs a
warning once. If the sandbox imports but refuses to run (``SandboxUnavailable``: bubblewrap
missing), the verdict is ``error`` and code tasks score 0: we never silently run unsandboxed.

Contract shared by both: ``tests`` holds ``test_*`` functions with plain asserts, run against
the program's definitions (same namespace); status is one of ``passed`` (every test passed),
``failed``, ``error`` (the program or tests did not load), ``timeout``, ``oom``, ``killed``.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)
STATUSES = ("passed", "failed", "error", "timeout", "oom", "killed")

# Runs in the child: program and tests share one namespace; every test_* function is called.
_HARNESS = r"""
import json, sys
src_dir, verdict_path = sys.argv[1], sys.argv[2]
def verdict(status, detail=""):
    with open(verdict_path, "w") as f:
        json.dump({"status": status, "detail": detail[:500]}, f)
ns = {"__name__": "__candidate__"}
try:
    exec(compile(open(src_dir + "/program.py").read(), "program.py", "exec"), ns)
    exec(compile(open(src_dir + "/tests.py").read(), "tests.py", "exec"), ns)
except MemoryError:
    verdict("oom"); raise SystemExit(0)
except BaseException as e:
    verdict("error", f"{type(e).__name__}: {e}"); raise SystemExit(0)
failed = []
for name in [n for n in list(ns) if n.startswith("test_") and callable(ns[n])]:
    try:
        ns[name]()
    except MemoryError:
        verdict("oom"); raise SystemExit(0)
    except BaseException as e:
        failed.append(f"{name}: {type(e).__name__}: {e}")
verdict("failed" if failed else "passed", "; ".join(failed))
"""


@dataclass
class ExecResult:
    """Same fields the sandbox's ExecResult has (the ones code domains read)."""

    status: str  # one of STATUSES
    exit_code: int | None = None
    duration_s: float = 0.0
    stdout: str = ""
    stderr: str = ""


def _limit_memory(memory_mb: int) -> None:
    limit = memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def run_program_subprocess(
    program: str, tests: str | None, timeout_s: float, memory_mb: int
) -> ExecResult:
    """Unsandboxed fallback: run ``program`` + ``tests`` in a ``python -I`` child process."""
    import time

    with tempfile.TemporaryDirectory(prefix="mrl-code-") as tmp:
        Path(tmp, "program.py").write_text(program)
        Path(tmp, "tests.py").write_text(tests or "")
        verdict_path = os.path.join(tmp, "verdict.json")
        start = time.perf_counter()
        try:
            proc = subprocess.run(
                [sys.executable, "-I", "-c", _HARNESS, tmp, verdict_path],
                cwd=tmp,
                capture_output=True,
                text=True,
                timeout=timeout_s,
                preexec_fn=lambda: _limit_memory(memory_mb),
            )
        except subprocess.TimeoutExpired:
            return ExecResult("timeout", None, time.perf_counter() - start)
        duration = time.perf_counter() - start
        try:
            verdict = json.loads(Path(verdict_path).read_text())
            status = verdict["status"] if verdict["status"] in STATUSES else "error"
        except (OSError, ValueError, KeyError):  # child died before writing a verdict
            status = "killed" if proc.returncode < 0 else "error"
        return ExecResult(
            status, proc.returncode, duration, proc.stdout[-2000:], proc.stderr[-2000:]
        )


def _runner():  # type: ignore[no-untyped-def]
    try:
        from megatron_rl.rewards.sandbox import run_program  # type: ignore[attr-defined]
    except ImportError:
        if not getattr(_runner, "warned", False):
            log.warning(
                "megatron_rl.rewards.sandbox.run_program not available: code is run "
                "UNSANDBOXED in a subprocess (fallback)"
            )
            _runner.warned = True  # type: ignore[attr-defined]
        return run_program_subprocess
    return run_program


def run_tests(program: str, tests: str, timeout_s: float = 5.0, memory_mb: int = 512) -> ExecResult:
    """Run ``program`` against ``tests`` in the sandbox (or the fallback); never raises."""
    try:
        return _runner()(program, tests, timeout_s=timeout_s, memory_mb=memory_mb)  # type: ignore[no-any-return]
    except Exception as e:  # the sandbox refusing to run (e.g. no isolation tool) is an error
        return ExecResult("error", None, 0.0, "", f"sandbox failed: {type(e).__name__}: {e}")
