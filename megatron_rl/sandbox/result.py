"""What one sandboxed execution returns, and the error raised when no sandbox can run."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

STATUSES = ("passed", "failed", "error", "timeout", "oom", "killed")


class SandboxUnavailable(RuntimeError):
    """The isolation tool is missing or cannot create namespaces on this machine."""


@dataclass
class ExecResult:
    """Outcome of one program (and optional tests) run in the sandbox.

    ``status`` is the only field a reward should read: ``passed`` means the program exited 0
    (no tests) or every test passed (with tests), as decided by the harness.
    """

    status: str  # one of STATUSES
    exit_code: int | None  # candidate process exit status (negative: killed by that signal)
    duration_s: float  # wall time of the whole execution, seconds
    stdout: str = ""  # candidate's stdout, truncated to the output limit
    stderr: str = ""  # candidate's stderr, truncated to the output limit
    tests_passed: int = 0  # tests that passed (0 without tests)
    tests_total: int = 0  # tests found in the tests file (0 without tests)
    reason: str = ""  # why the status is not ``passed`` (first failing test, limit hit, ...)
    sandboxed: bool = True  # False only for the explicit, logged unsandboxed fallback
    failures: list[str] = field(default_factory=list)  # "test_name: error" per failed test

    def __post_init__(self) -> None:
        assert self.status in STATUSES, self.status

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    def to_dict(self) -> dict:
        return asdict(self)
