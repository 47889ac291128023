"""Starting one bubblewrap sandbox for one process, and checking that it works.

Each process (the candidate, or the judge) gets its own bwrap instance with every namespace
unshared (user, pid, net, ipc, uts, cgroup): no network but a private loopback, no view of host
processes, and pid 1 of its namespace is bwrap's init, so when the main process exits every
process it left behind is killed by the kernel. The file system is a read-only bind of ``/usr``
(with the usual ``/bin``, ``/lib`` symlinks), the harness scripts and the one file that process
may see copied in read-only (``/harness``, ``/data``), size-limited tmpfs mounts for the work
directory, ``/tmp`` and ``/dev/shm``, and everything else read-only. Nothing of ``/etc``,
``/root``, ``/home``, ``/sys`` or the repository is mounted, and nothing of the host reaches
the sandbox's processes: bwrap starts with SANDBOX_ENV as its whole environment, from ``/``,
with no host path among its arguments (see Launch and docs/sandbox.md's exposure review).

No way back out. bwrap is told ``--disable-userns`` (the sandbox runs in a second user namespace
whose parent allows no more of them, so the program cannot create one and regain capabilities
there) and ``--seccomp`` with the filter of ``seccomp.py``, which it loads just before it
executes the command (and into its pid-1 init): new namespaces, mounts, ptrace, bpf, keyrings,
perf events, io_uring and netlink beyond routing are denied to the program and everything it
starts. A machine whose architecture has no filter there has no sandbox (SandboxUnavailable).

Unprivileged user. When the host process is root (as in CI), bwrap would map the sandbox user to
root outside the namespace, which makes RLIMIT_NPROC unenforced (the kernel exempts root) and
lets the sandbox own root's files on any mount. So bwrap itself is started as an unprivileged
uid (``Popen(user=...)``), one uid per concurrent process from a small range, so that process
limits are counted per execution and parallel runs do not share them. The interpreter used inside
is the system Python under ``/usr`` (the venv's interpreter may live under a root-only home).
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import platform
import random
import shutil
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from megatron_rl.sandbox import memory, seccomp
from megatron_rl.sandbox.memory import SandboxCgroup
from megatron_rl.sandbox.result import SandboxUnavailable

log = logging.getLogger(__name__)

HARNESS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "inside")
SANDBOX_PYTHON = "/usr/bin/python3"  # interpreter inside the sandbox (must live under /usr)
UID_BASE = 200_000  # first uid handed to sandboxed processes when the host runs as root
UID_COUNT = 50_000  # size of that uid range (no /etc/passwd entries needed)
HARNESS_FILES = ("child.py", "judge.py", "wire.py", "confine.py")  # copied to /harness
# The whole environment of bwrap and of every process in the sandbox: nothing of the host's.
SANDBOX_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/work"}


@dataclass(frozen=True)
class Mounts:
    """What one sandboxed process sees besides ``/usr``: files copied in, never host paths."""

    files: dict[str, bytes]  # file name -> content, read-only at /data/NAME inside
    tmpfs_mb: int = 64  # size of each private tmpfs (/work, /tmp, /dev/shm), MiB


@functools.cache
def harness_sources() -> dict[str, bytes]:
    """The harness scripts, read once; each sandbox gets its own copies at /harness."""
    sources = {}
    for name in HARNESS_FILES:
        with open(os.path.join(HARNESS_DIR, name), "rb") as f:
            sources[name] = f.read()
    return sources


@functools.cache
def seccomp_filter() -> bytes:
    """The compiled seccomp filter for this machine's architecture (seccomp.py)."""
    try:
        return seccomp.for_machine(platform.machine())
    except ValueError as e:
        raise SandboxUnavailable(f"no sandbox on this machine: {e}") from None


def _memfd(name: str, data: bytes) -> int:
    """An anonymous in-memory file holding ``data``, positioned at its start."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


class UidPool:
    """Hands out distinct unprivileged uids so concurrent sandboxes never share process limits.

    Each host process starts at a random place in the range, so several processes using the
    sandbox at once (trainer ranks, a CLI run beside a test) are unlikely to share uids.
    """

    def __init__(self, base: int = UID_BASE, count: int = UID_COUNT, width: int = 256) -> None:
        start = base + random.randrange(max(1, count - width + 1))
        self.uids = range(start, start + min(width, count))  # the uids this pool hands out
        self._free = list(reversed(self.uids))
        self._lock = threading.Lock()

    def acquire(self) -> int:
        with self._lock:
            if not self._free:
                raise RuntimeError("sandbox uid range exhausted (too many concurrent executions)")
            return self._free.pop()

    def release(self, uid: int) -> None:
        with self._lock:
            self._free.append(uid)


UIDS = UidPool()


class Launch:
    """One bwrap start whose options travel through a pipe, not its command line.

    bwrap reads its options from ``--args FD`` before it does anything, so it waits until
    ``release`` writes them: the host can first move it into the sandbox's memory cgroup, so
    every process it forks is born there. The options hold only paths as seen inside and fd
    numbers; files arrive as memfds copied into the sandbox (``--ro-bind-data``), so neither
    ``/proc/1/cmdline``, ``/proc/1/mem`` nor ``/proc/self/mountinfo`` shows a host path.
    """

    def __init__(self, mounts: Mounts, argv: list[str], info_fd: int | None = None) -> None:
        self._fds: list[int] = []
        try:
            options = self._options(mounts, info_fd)
            self._args_r, self._args_w = os.pipe()
        except BaseException:
            self.close()
            raise
        self._fds.append(self._args_r)
        self.options = b"".join(o.encode() + b"\0" for o in options)  # what bwrap reads
        self.argv = [shutil.which("bwrap") or "bwrap", "--args", str(self._args_r), "--", *argv]
        self.pass_fds = tuple(self._fds)  # fds bwrap must inherit (memfds and the options pipe)

    def _file(self, name: str, data: bytes, dest: str) -> list[str]:
        self._fds.append(_memfd(name, data))
        return ["--perms", "0444", "--ro-bind-data", str(self._fds[-1]), dest]

    def _options(self, mounts: Mounts, info_fd: int | None) -> list[str]:
        size = str(mounts.tmpfs_mb << 20)
        files: list[str] = []
        for name, data in harness_sources().items():
            files += self._file(name, data, f"/harness/{name}")
        for name, data in mounts.files.items():
            files += self._file(name, data, f"/data/{name}")
        setenv = [a for k, v in SANDBOX_ENV.items() for a in ("--setenv", k, v)]
        self._fds.append(_memfd("seccomp", seccomp_filter()))
        return [
            *["--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL"],
            *["--unshare-user", "--disable-userns", "--seccomp", str(self._fds[-1])],
            *["--hostname", "sandbox"],
            *["--ro-bind", "/usr", "/usr"],
            *["--symlink", "usr/bin", "/bin", "--symlink", "usr/sbin", "/sbin"],
            *["--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64"],
            *["--proc", "/proc"],
            *["--ro-bind-data", str(self._memfd_empty()), "/proc/cmdline"],
            *["--dev", "/dev"],
            *["--size", size, "--tmpfs", "/dev/shm"],
            *["--size", size, "--tmpfs", "/tmp"],
            *["--size", size, "--tmpfs", "/work"],
            *files,
            *["--remount-ro", "/dev", "--remount-ro", "/"],
            *["--chdir", "/work", "--clearenv", *setenv],
            *(["--info-fd", str(info_fd)] if info_fd is not None else []),
        ]

    def _memfd_empty(self) -> int:
        self._fds.append(_memfd("empty", b""))
        return self._fds[-1]

    def release(self) -> None:
        """Hand bwrap its options (it is waiting for them) and close the host's copies."""
        view = memoryview(self.options)
        try:
            while view:
                view = view[os.write(self._args_w, view) :]
        finally:
            self.close()

    def close(self) -> None:
        for fd in (*self._fds, getattr(self, "_args_w", -1)):
            if fd >= 0:
                os.close(fd)
        self._fds, self._args_w = [], -1


def drop_to_uid() -> bool:
    """Whether bwrap must be started as an unprivileged uid (true when the host is root)."""
    return os.geteuid() == 0


# keyctl(2) per architecture; KEYCTL_JOIN_SESSION_KEYRING with no name = a new, empty keyring
_SYS_KEYCTL = {"x86_64": 250, "aarch64": 219}
_KEYCTL_JOIN_SESSION_KEYRING = 1
_SYS_LANDLOCK_CREATE_RULESET = 444  # the same on every architecture


def _leave_session_keyring() -> None:
    """Give the calling thread a new, empty session keyring.

    The session keyring is inherited through fork and exec and across uid changes, and whoever
    holds it may read every key linked to it (possession grants the rights). bwrap is forked from
    a thread that ran this, so the sandbox never holds the host's keys (Kerberos tickets, tokens).
    """
    number = _SYS_KEYCTL.get(platform.machine())
    libc = ctypes.CDLL(None, use_errno=True)
    if number is None or libc.syscall(number, _KEYCTL_JOIN_SESSION_KEYRING, None) < 0:
        log.warning(
            "sandbox: cannot give the spawning thread its own session keyring (%s, %s)",
            platform.machine(),
            os.strerror(ctypes.get_errno()),
        )


def landlock_abi() -> int:
    """The kernel's Landlock ABI version (0: none); the harness enters a domain when >= 1."""
    libc = ctypes.CDLL(None, use_errno=True)
    return max(0, libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, None, 0, 1))


_spawners: tuple[int, ThreadPoolExecutor] | None = None  # (owning pid, threads)
_spawners_lock = threading.Lock()


def _reset_spawners_lock() -> None:
    global _spawners_lock
    _spawners_lock = threading.Lock()  # a fork may have happened while another thread held it


os.register_at_fork(after_in_child=_reset_spawners_lock)


def _spawner_threads() -> ThreadPoolExecutor:
    """The threads that fork every bwrap (never a thread of the host's own); made anew in a
    forked child, where the parent's threads do not exist."""
    global _spawners
    with _spawners_lock:
        if _spawners is None or _spawners[0] != os.getpid():
            pool = ThreadPoolExecutor(4, "sandbox-spawn", initializer=_leave_session_keyring)
            _spawners = (os.getpid(), pool)
        return _spawners[1]


def _popen(launch: Launch, uid: int | None, fds: tuple[int, ...]) -> subprocess.Popen:
    return subprocess.Popen(
        launch.argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        pass_fds=(*fds, *launch.pass_fds),
        start_new_session=True,
        cwd="/",
        env=SANDBOX_ENV,
        user=uid,
        group=uid,
        extra_groups=[] if uid is not None else None,
    )


def start(
    launch: Launch, uid: int | None, fds: tuple[int, ...] = (), cgroup: SandboxCgroup | None = None
) -> subprocess.Popen:
    """Start bwrap for ``launch`` with only SANDBOX_ENV and a fresh session keyring (as ``uid``
    unless None), move it into ``cgroup`` while it still waits for its options, hand them over."""
    try:
        popen = _spawner_threads().submit(_popen, launch, uid, fds).result()
    except BaseException:
        launch.close()
        raise
    try:
        if cgroup is not None:
            try:
                cgroup.add(popen.pid)
            except OSError as e:
                log.warning("sandbox: cannot move bwrap into %s (%s)", cgroup.path, e)
        launch.release()
    except BaseException:
        launch.close()
        popen.kill()
        popen.communicate()
        raise
    return popen


@functools.cache
def check_available() -> None:
    """Raise SandboxUnavailable unless bwrap exists and can create its namespaces here."""
    if shutil.which("bwrap") is None:
        raise SandboxUnavailable(
            "bubblewrap (bwrap) is not installed; install the Debian package 'bubblewrap' "
            "(launch/setup_env.sh does), or pass allow_unsandboxed=True to run code WITHOUT "
            "isolation"
        )
    if not os.path.exists(SANDBOX_PYTHON):
        raise SandboxUnavailable(f"the sandbox interpreter {SANDBOX_PYTHON} does not exist")
    uid = UIDS.acquire() if drop_to_uid() else None
    try:
        launch = Launch(Mounts(files={}, tmpfs_mb=1), [SANDBOX_PYTHON, "-I", "-c", ""])
        probe = start(launch, uid)
        try:
            _, stderr = probe.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            probe.kill()
            _, stderr = probe.communicate()
    finally:
        if uid is not None:
            UIDS.release(uid)
    if probe.returncode != 0:
        raise SandboxUnavailable(
            f"bwrap cannot create a sandbox here (exit {probe.returncode}): "
            f"{stderr.decode(errors='replace').strip()[:500]}; user namespaces may be "
            "disabled (sysctl kernel.unprivileged_userns_clone / user.max_user_namespaces)"
        )
    memory.detect()  # says once, at start-up, which memory bound is in force
