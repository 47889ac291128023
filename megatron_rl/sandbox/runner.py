"""Run one program (and optionally its tests) in the sandbox and decide the verdict.

Without tests, one sandboxed process runs the program as ``__main__``; ``passed`` means exit 0.
With tests, two sandboxes run side by side and never see each other (separate pid, user and
mount namespaces, separate uids):

    host ──spawn──> candidate sandbox: child.py loads the program, answers calls   (req_r, resp_w)
    host ──spawn──> judge sandbox:     judge.py runs test_* against proxies       (req_w, resp_r,
                                                                                    verdict_w)
    host <──verdict pipe── judge (one JSON line per test, then ``done``)

The test file is mounted only into the judge's sandbox, the verdict pipe exists only between the
judge and the host, and the judge executes none of the candidate's code (only plain data crosses,
see inside/wire.py). So the candidate cannot read the tests or their expected values from disk,
cannot write to the verdict channel, cannot fake a pass by exiting 0 early (its exit status is
ignored in this mode, and missing answers fail the tests), and cannot patch anything the judge
uses. The host kills both process trees at the wall-time deadline or when output exceeds its
limit; the pid namespaces guarantee that nothing the candidate started survives.
"""

from __future__ import annotations

import json
import logging
import os
import select
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Protocol

from megatron_rl.sandbox import isolation, memory
from megatron_rl.sandbox.result import ExecResult
from megatron_rl.sandbox.verdict import Collected, classify

log = logging.getLogger(__name__)


class SandboxSettings(Protocol):
    """The ``rewards.sandbox_*`` settings a pool and its limits are made from
    (:class:`~megatron_rl.rewards.config.RewardsConfig` holds them). The sandbox imports nothing
    of the library above it: the domain API runs code in it (``domains/code_exec.py``)."""

    sandbox_timeout_s: float
    sandbox_memory_mb: int
    sandbox_max_procs: int
    sandbox_max_output_kb: int
    sandbox_workers: int
    allow_unsandboxed: bool


@dataclass(frozen=True)
class Limits:
    """Resource limits of one execution."""

    timeout_s: float = 10.0  # wall time for the whole execution, seconds
    memory_mb: int = 512  # per process (address space) and per sandbox with a cgroup, MiB
    max_procs: int = 8  # processes (and threads) per sandbox; without a cgroup, x memory_mb
    max_files: int = 64  # open file descriptors per process
    max_file_mb: int = 16  # largest file a process may write, MiB
    tmpfs_mb: int = 32  # size of each private tmpfs (/work, /tmp, /dev/shm), MiB
    max_output_bytes: int = 1 << 20  # stdout + stderr beyond this kills the execution

    @classmethod
    def from_config(cls, cfg: SandboxSettings) -> Limits:
        """Limits from the ``rewards.sandbox_*`` config fields."""
        return cls(
            timeout_s=cfg.sandbox_timeout_s,
            memory_mb=cfg.sandbox_memory_mb,
            max_procs=cfg.sandbox_max_procs,
            max_output_bytes=cfg.sandbox_max_output_kb << 10,
        )

    def __post_init__(self) -> None:
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0 seconds, got {self.timeout_s}")
        if self.memory_mb < 64:
            raise ValueError(
                f"memory_mb must be >= 64 (the interpreter needs it), got {self.memory_mb}"
            )
        if self.max_procs < 1 or self.max_files < 16 or self.max_output_bytes < 1024:
            raise ValueError("max_procs must be >= 1, max_files >= 16, max_output_bytes >= 1024")


@dataclass
class _Proc:
    popen: subprocess.Popen
    uid: int | None
    info_fd: int | None = None  # read end of bwrap's --info-fd until it has been read
    init_pidfd: int | None = None  # pidfd of the sandbox's pid-1 process (None: unsandboxed)
    cgroup: memory.SandboxCgroup | None = None  # the sandbox's memory cgroup, if it has one
    workdir: str | None = None  # host directory of an unsandboxed run (removed at the end)
    out: bytearray = field(default_factory=bytearray)
    err: bytearray = field(default_factory=bytearray)


def _cgroup(memory_mb: int) -> memory.SandboxCgroup | None:
    """A memory cgroup for one sandbox where the machine has them (a failure only warns)."""
    bound = memory.detect()
    if bound.kind not in memory.CGROUP_KINDS:
        return None
    try:
        return memory.SandboxCgroup(bound, memory_mb)
    except OSError as e:
        log.warning("sandbox: no memory cgroup for this run (%s); memory bound per process", e)
        return None


def _spawn_sandboxed(
    argv: list[str], files: dict[str, str], fds: tuple[int, ...], limits: Limits, memory_mb: int
) -> _Proc:
    """Start ``argv`` (``{H}``/``{D}`` = harness/data dir) in its own sandbox, with ``files``
    copied into its /data and, where the machine allows, its own memory cgroup."""
    argv = [a.replace("{H}", "/harness").replace("{D}", "/data") for a in argv]
    mounts = isolation.Mounts({n: t.encode() for n, t in files.items()}, limits.tmpfs_mb)
    info_r, info_w = os.pipe()
    uid = group = None
    try:
        launch = isolation.Launch(mounts, argv, info_w)
        group = _cgroup(memory_mb)
        uid = isolation.UIDS.acquire() if isolation.drop_to_uid() else None
        popen = isolation.start(launch, uid, (*fds, info_w), group)
    except BaseException:
        os.close(info_r)
        if uid is not None:
            isolation.UIDS.release(uid)
        if group is not None:
            group.remove()
        raise
    finally:
        os.close(info_w)
    return _Proc(popen, uid, info_fd=info_r, cgroup=group)


def _spawn_plain(argv: list[str], files: dict[str, str], fds: tuple[int, ...]) -> _Proc:
    """Start ``argv`` as a plain process (the unsandboxed fallback), ``files`` in a temp dir."""
    workdir = tempfile.mkdtemp(prefix="mrl-unsandboxed-")
    for name, text in files.items():
        _write(workdir, name, text)
    argv = [a.replace("{H}", isolation.HARNESS_DIR).replace("{D}", workdir) for a in argv]
    env = {**isolation.SANDBOX_ENV, "HOME": workdir}
    try:
        popen = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=fds,
            start_new_session=True,
            cwd=workdir,
            env=env,
        )
    except BaseException:
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    return _Proc(popen, None, workdir=workdir)


def _spawn(
    argv: list[str],
    files: dict[str, str],
    fds: tuple[int, ...],
    limits: Limits,
    sandboxed: bool,
    memory_mb: int,
) -> _Proc:
    if sandboxed:
        return _spawn_sandboxed(argv, files, fds, limits, memory_mb)
    return _spawn_plain(argv, files, fds)


def _watch(procs: list[_Proc]) -> None:
    """Take a pidfd on each sandbox's pid 1 (after all are spawned, so they start in parallel)."""
    for p in procs:
        if p.info_fd is not None:
            p.init_pidfd, p.info_fd = _init_pidfd(p.info_fd, p.uid), None


def _init_pidfd(info_r: int, uid: int | None) -> int | None:
    """A pidfd for the sandbox's pid 1, from the JSON bwrap writes to its --info-fd.

    Killing that process kills everything in the sandbox's pid namespace; holding a pidfd (not a
    pid) makes the kill safe even after the process is gone and its pid reused.
    """
    data = b""
    try:
        while chunk := os.read(info_r, 4096):
            data += chunk
    finally:
        os.close(info_r)
    try:
        pid = int(json.loads(data)["child-pid"])
        pidfd = os.pidfd_open(pid)
    except (ValueError, KeyError, OSError):
        return None  # bwrap failed to start the sandbox (its exit status says why), or it ended
    try:
        if uid is None or os.stat(f"/proc/{pid}").st_uid == uid:
            return pidfd  # still our sandbox's process, not a reused pid
    except OSError:
        pass
    os.close(pidfd)
    return None


def _kill(proc: _Proc) -> None:
    try:
        os.killpg(proc.popen.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _collect(procs: list[_Proc], verdict_fd: int | None, limits: Limits) -> Collected:
    """Drain every pipe until all close, the deadline passes or output exceeds its limit."""
    got = Collected(deadline=time.monotonic() + limits.timeout_s)
    sel = selectors.DefaultSelector()
    for p in procs:
        assert p.popen.stdout is not None and p.popen.stderr is not None
        sel.register(p.popen.stdout, selectors.EVENT_READ, p.out)
        sel.register(p.popen.stderr, selectors.EVENT_READ, p.err)
    verdict = bytearray()
    if verdict_fd is not None:
        sel.register(verdict_fd, selectors.EVENT_READ, verdict)
    while sel.get_map():
        left = got.deadline - time.monotonic()
        if left <= 0:
            got.timed_out = True
            break
        for key, _ in sel.select(timeout=left):
            chunk = os.read(key.fd, 65536)
            if not chunk:
                sel.unregister(key.fileobj)
                continue
            key.data.extend(chunk)
        if sum(len(p.out) + len(p.err) for p in procs) > limits.max_output_bytes:
            got.output_exceeded = True
            break
    sel.close()
    got.verdict = bytes(verdict)
    return got


def _end_namespace(proc: _Proc) -> None:
    """Kill the sandbox's pid 1 (so the kernel kills every process left in its namespace) and
    wait until it has exited, so nothing of the sandbox runs once the result is returned."""
    _watch([proc])
    if proc.init_pidfd is None:
        return
    try:
        signal.pidfd_send_signal(proc.init_pidfd, signal.SIGKILL)
    except ProcessLookupError:
        pass
    select.select([proc.init_pidfd], [], [], 10.0)
    os.close(proc.init_pidfd)
    proc.init_pidfd = None


def _exited_by(proc: _Proc, deadline: float) -> bool:
    """Wait (on a pidfd, without polling) until the process exits or the deadline passes."""
    pidfd = os.pidfd_open(proc.popen.pid)  # our unreaped child: the pid cannot be reused
    try:
        ready, _, _ = select.select([pidfd], [], [], max(0.0, deadline - time.monotonic()))
    finally:
        os.close(pidfd)
    return bool(ready)


def _finish(procs: list[_Proc], got: Collected, limits: Limits) -> None:
    """Kill what is left, reap every process, note a cgroup OOM kill and free what it held."""
    for p in procs:
        if got.timed_out or got.output_exceeded:
            _kill(p)
        elif not _exited_by(p, got.deadline):
            got.timed_out = True  # closed its output but kept running past the deadline
            _kill(p)
        p.popen.wait()
        for stream in (p.popen.stdout, p.popen.stderr):
            if stream is not None:
                stream.close()
        _end_namespace(p)
    got.oom_killed = procs[0].cgroup is not None and procs[0].cgroup.oom_kills() > 0
    for p in procs:
        _release(p)


def _release(proc: _Proc) -> None:
    """Once its processes are gone: remove its cgroup and work dir, free its uid."""
    if proc.popen.returncode is None:
        _kill(proc)
        proc.popen.wait()
    _end_namespace(proc)
    if proc.cgroup is not None:
        proc.cgroup.remove()
        proc.cgroup = None
    if proc.uid is not None:
        isolation.UIDS.release(proc.uid)
        proc.uid = None
    if proc.workdir is not None:
        shutil.rmtree(proc.workdir, ignore_errors=True)
        proc.workdir = None


def _write(directory: str, name: str, text: str) -> None:
    with open(os.path.join(directory, name), "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(os.path.join(directory, name), 0o644)


def _python() -> str:
    """The system interpreter (used inside the sandbox); the current one if there is none."""
    return isolation.SANDBOX_PYTHON if os.path.exists(isolation.SANDBOX_PYTHON) else sys.executable


def _child_argv(limits: Limits) -> list[str]:
    cpu_s = int(limits.timeout_s) + 1
    return [
        *[_python(), "-I", "-S", "-B", "{H}/child.py", "{D}/solution.py"],
        *[str(limits.memory_mb), str(cpu_s), str(limits.max_procs), str(limits.max_files)],
        str(limits.max_file_mb << 20),
    ]


def execute(program: str, tests: str | None, limits: Limits, sandboxed: bool) -> ExecResult:
    """Run ``program`` (and ``tests``) under ``limits``; see the module docstring."""
    start = time.monotonic()
    procs: list[_Proc] = []
    pipes: list[int] = []
    solution = {"solution.py": program}
    try:
        if tests is None:
            child = _child_argv(limits)
            procs.append(_spawn(child, solution, (), limits, sandboxed, limits.memory_mb))
            _watch(procs)
            got = _collect(procs, None, limits)
        else:
            req_r, req_w = os.pipe()
            resp_r, resp_w = os.pipe()
            verdict_r, verdict_w = os.pipe()
            pipes = [req_r, req_w, resp_r, resp_w, verdict_r, verdict_w]
            child = _child_argv(limits) + [str(req_r), str(resp_w)]
            fds: tuple[int, ...] = (req_r, resp_w)
            procs.append(_spawn(child, solution, fds, limits, sandboxed, limits.memory_mb))
            judge_mb = max(limits.memory_mb, 256)
            judge = [
                *[_python(), "-I", "-S", "-B", "{H}/judge.py", "{D}/tests.py", str(judge_mb)],
                *[str(int(limits.timeout_s) + 1), str(req_w), str(resp_r), str(verdict_w)],
            ]
            fds, files = (req_w, resp_r, verdict_w), {"tests.py": tests}
            procs.append(_spawn(judge, files, fds, limits, sandboxed, judge_mb))
            for fd in (req_r, req_w, resp_r, resp_w, verdict_w):
                os.close(fd)
            pipes = [verdict_r]
            _watch(procs)
            got = _collect(procs, verdict_r, limits)
        _finish(procs, got, limits)
        got.exit_codes = [p.popen.returncode for p in procs]
        got.stdout, got.stderr = bytes(procs[0].out), bytes(procs[0].err)
        got.judge_stderr = bytes(procs[1].err) if len(procs) > 1 else b""
        return classify(got, tests is not None, time.monotonic() - start, sandboxed)
    finally:
        for p in procs:
            _release(p)
        for fd in pipes:
            os.close(fd)


def run_program(
    program: str,
    tests: str | None = None,
    timeout_s: float = 10.0,
    memory_mb: int = 512,
    allow_unsandboxed: bool = False,
    limits: Limits | None = None,
) -> ExecResult:
    """Run ``program`` in the sandbox; with ``tests`` (a file of ``test_*`` functions with plain
    asserts that call the program's definitions by name) ``passed`` means every test passed.

    Raises SandboxUnavailable when bubblewrap cannot run, unless ``allow_unsandboxed`` (then the
    program runs WITHOUT isolation, with a warning logged on every call).
    """
    limits = limits or Limits(timeout_s=timeout_s, memory_mb=memory_mb)
    try:
        isolation.check_available()
        sandboxed = True
    except Exception:
        if not allow_unsandboxed:
            raise
        sandboxed = False
        log.warning(
            "SANDBOX UNAVAILABLE: running model-written code WITHOUT isolation "
            "(allow_unsandboxed=True); never do this on a machine you care about"
        )
    return execute(program, tests, limits, sandboxed)
