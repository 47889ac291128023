"""Run a candidate program against hidden tests: the one adapter between domains and the sandbox.

Code domains call :func:`run_tests` only. It uses ``megatron_rl.sandbox.run_program``
(bubblewrap isolation, verdicts the candidate cannot forge; see ``docs/sandbox.md``). We never
silently run unsandboxed: if the sandbox cannot run (its package fails to import, bubblewrap is
missing or cannot start: ``SandboxUnavailable``, or it fails in any other way), the result is an
``error`` whose ``sandbox_error`` says why, logged once per process; the code verifier turns it
into a verdict the run counts as a verification failure (``health/<domain>/verify_error`` and
``rollout/verifier_errors``, see ``megatron_rl/domains/verifiers.py``), never into a reward.

Only with ``rewards.allow_unsandboxed: true`` (set in each process that verifies by
:func:`configure`, which the run calls from its config) does code run without isolation: the
sandbox's own unsandboxed mode when the package imports, else :func:`run_program_subprocess`
below, a plain ``python -I`` subprocess with a wall-clock timeout and an address-space limit,
which is **not** a security boundary (the candidate runs as this user, with this machine's
network, and could forge its verdict; only the environment is a fresh one); both log a warning
on every call.

Contract shared by both: ``tests`` holds ``test_*`` functions with plain asserts, run against
the program's definitions (same namespace); status is one of ``passed`` (every test passed),
``failed``, ``error`` (the program or tests did not load, or no sandbox could run them),
``timeout``, ``oom``, ``killed``.
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
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from megatron_rl.sandbox import ExecResult as SandboxResult

log = logging.getLogger(__name__)
STATUSES = ("passed", "failed", "error", "timeout", "oom", "killed")
_settings = {"allow_unsandboxed": False}  # rewards.allow_unsandboxed of this process's run
_warned: set[str] = set()  # kinds of sandbox failure this process has logged

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
    sandbox_error: str = ""  # why no sandbox could run the program (never its fault); "" if ran


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
                env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": tmp},  # none of ours
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


def configure(allow_unsandboxed: bool) -> None:
    """Set this process's ``rewards.allow_unsandboxed``: whether code may run without isolation
    when the sandbox cannot. A run calls it in its own process and in every domain worker."""
    _settings["allow_unsandboxed"] = bool(allow_unsandboxed)


def _sandbox() -> tuple[Any, str]:
    """``run_program`` of the sandbox package, or None and why it cannot be imported."""
    try:
        from megatron_rl.sandbox import run_program
    except Exception as e:  # any import failure (a missing module, a bad build)
        return None, f"the sandbox cannot be imported: {type(e).__name__}: {e}"
    return run_program, ""


def _no_sandbox(kind: str, why: str) -> ExecResult:
    """The ``error`` result of a program that no sandbox could run; logged once per ``kind``."""
    if kind not in _warned:
        _warned.add(kind)
        log.error(
            "code rewards cannot run sandboxed (%s): each is an error verdict, counted as a "
            "verify_error; set rewards.allow_unsandboxed=true to run code WITHOUT isolation",
            why,
        )
    return ExecResult("error", None, 0.0, "", f"sandbox unavailable: {why}", sandbox_error=why)


def run_tests(
    program: str,
    tests: str,
    timeout_s: float = 5.0,
    memory_mb: int = 512,
    allow_unsandboxed: bool | None = None,
) -> ExecResult | SandboxResult:
    """Run ``program`` against ``tests`` in the sandbox; never raises. ``allow_unsandboxed``:
    run without isolation if the sandbox cannot (None: this process's :func:`configure`)."""
    allow = _settings["allow_unsandboxed"] if allow_unsandboxed is None else allow_unsandboxed
    run_program, why = _sandbox()
    if run_program is None:
        if not allow:
            return _no_sandbox("import", why)
        log.warning(
            "SANDBOX UNAVAILABLE (%s): running model-written code UNSANDBOXED in a subprocess, "
            "as this user, with this machine's network (rewards.allow_unsandboxed=true)",
            why,
        )
        return run_program_subprocess(program, tests, timeout_s, memory_mb)
    try:
        res: SandboxResult = run_program(
            program, tests, timeout_s=timeout_s, memory_mb=memory_mb, allow_unsandboxed=allow
        )
    except Exception as e:  # SandboxUnavailable, or the sandbox itself failing
        return _no_sandbox(type(e).__name__, f"{type(e).__name__}: {e}")
    return res
