"""Building the bubblewrap command line for one sandboxed process, and checking it works.

Each process (the candidate, or the judge) gets its own bwrap instance with every namespace
unshared (user, pid, net, ipc, uts, cgroup): no network but a private loopback, no view of host
processes, and pid 1 of its namespace is bwrap's init, so when the main process exits every
process it left behind is killed by the kernel. The file system is a read-only bind of ``/usr``
(with the usual ``/bin``, ``/lib`` symlinks), a read-only directory with the harness scripts,
a read-only directory with the one file that process may see, and size-limited tmpfs mounts for
the work directory, ``/tmp`` and ``/dev/shm``. Nothing of ``/etc``, ``/root``, ``/home`` or the
repository is mounted.

Unprivileged user. When the host process is root (as in CI), bwrap would map the sandbox user to
root outside the namespace, which makes RLIMIT_NPROC unenforced (the kernel exempts root) and
lets the sandbox own root's files on any mount. So bwrap itself is started as an unprivileged
uid (``Popen(user=...)``), one uid per concurrent process from a small range, so that process
limits are counted per execution and parallel runs do not share them. The interpreter used inside
is the system Python under ``/usr`` (the venv's interpreter may live under a root-only home).
"""

from __future__ import annotations

import functools
import os
import random
import shutil
import subprocess
import threading
from dataclasses import dataclass

from megatron_rl.rewards.sandbox.result import SandboxUnavailable

HARNESS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "inside")
SANDBOX_PYTHON = "/usr/bin/python3"  # interpreter inside the sandbox (must live under /usr)
UID_BASE = 200_000  # first uid handed to sandboxed processes when the host runs as root
UID_COUNT = 50_000  # size of that uid range (no /etc/passwd entries needed)


@dataclass(frozen=True)
class Mounts:
    """Host paths one sandboxed process sees, and where."""

    data_dir: str  # host directory mounted read-only at /data
    tmpfs_mb: int = 64  # size of each private tmpfs (/work, /tmp, /dev/shm), MiB


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


def bwrap_argv(mounts: Mounts, argv: list[str], info_fd: int | None = None) -> list[str]:
    """The bwrap command that runs ``argv`` (paths as seen inside) in fresh namespaces; bwrap
    writes the host pid of the sandbox's pid 1 to ``info_fd`` as JSON."""
    info = ["--info-fd", str(info_fd)] if info_fd is not None else []
    size = str(mounts.tmpfs_mb << 20)
    return [
        shutil.which("bwrap") or "bwrap",
        "--unshare-all",
        "--die-with-parent",
        "--new-session",
        "--cap-drop", "ALL",
        "--hostname", "sandbox",
        "--ro-bind", "/usr", "/usr",
        "--symlink", "usr/bin", "/bin",
        "--symlink", "usr/sbin", "/sbin",
        "--symlink", "usr/lib", "/lib",
        "--symlink", "usr/lib64", "/lib64",
        "--proc", "/proc",
        "--dev", "/dev",
        "--size", size, "--tmpfs", "/dev/shm",
        "--size", size, "--tmpfs", "/tmp",
        "--size", size, "--tmpfs", "/work",
        "--ro-bind", HARNESS_DIR, "/harness",
        "--ro-bind", mounts.data_dir, "/data",
        "--chdir", "/work",
        "--clearenv",
        "--setenv", "PATH", "/usr/bin:/bin",
        "--setenv", "HOME", "/work",
        "--setenv", "LANG", "C.UTF-8",
        *info,
        "--",
        *argv,
    ]  # fmt: skip


def drop_to_uid() -> bool:
    """Whether bwrap must be started as an unprivileged uid (true when the host is root)."""
    return os.geteuid() == 0


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
    uid = UIDS.acquire()
    try:
        probe = subprocess.run(
            bwrap_argv(Mounts(data_dir=HARNESS_DIR, tmpfs_mb=1), [SANDBOX_PYTHON, "-I", "-c", ""]),
            capture_output=True,
            timeout=30,
            user=uid if drop_to_uid() else None,
            group=uid if drop_to_uid() else None,
            extra_groups=[] if drop_to_uid() else None,
        )
    finally:
        UIDS.release(uid)
    if probe.returncode != 0:
        raise SandboxUnavailable(
            f"bwrap cannot create a sandbox here (exit {probe.returncode}): "
            f"{probe.stderr.decode(errors='replace').strip()[:500]}; user namespaces may be "
            "disabled (sysctl kernel.unprivileged_userns_clone / user.max_user_namespaces)"
        )
