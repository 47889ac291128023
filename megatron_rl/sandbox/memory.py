"""The memory bound of a sandbox: a memory cgroup around all of its processes where this machine
lets us make one, else only the per-process address-space limit.

``detect`` chooses once per host process, and says once in the log which bound is in force:

* ``cgroup-v2``: the unified hierarchy, where this process's cgroup hands the memory controller
  to its children (``memory`` in its ``cgroup.subtree_control``, or we may write it there);
* ``cgroup-v1``: a cgroup v1 memory controller whose hierarchy this process may write to;
* ``per-process``: neither. Each process is held to ``memory_mb`` of address space (RLIMIT_AS),
  so one sandbox may use up to ``max_procs x memory_mb`` plus its tmpfs files.

With a cgroup, every sandbox gets its own child cgroup ``mrl-sbx-<host pid>-<n>`` of this
process's cgroup, limited to ``memory_mb`` (RAM, and RAM + swap where swap is accounted): all its
processes together and the files they write to its tmpfs mounts stay under it. bwrap is moved in
before it forks (see isolation.Launch) and the cgroup is removed when its last process is gone.
Cgroups a dead host process left behind are removed by the next ``detect`` in the same place.
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import re
import time
from dataclasses import dataclass

log = logging.getLogger(__name__)

PREFIX = "mrl-sbx"  # name prefix of every cgroup the sandbox makes
KINDS = ("cgroup-v2", "cgroup-v1", "per-process")
CGROUP_KINDS = KINDS[:2]  # the kinds that bound a whole sandbox
_LIMIT_FILES = {  # kind -> (RAM limit file, RAM+swap or swap limit file, OOM-kill counter file)
    "cgroup-v2": ("memory.max", "memory.swap.max", "memory.events"),
    "cgroup-v1": ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes", "memory.oom_control"),
}
_counter = itertools.count()


@dataclass(frozen=True)
class MemoryBound:
    """Which memory bound sandboxes get on this machine, and why."""

    kind: str  # one of KINDS
    parent: str  # cgroup directory the sandboxes' cgroups are made in ("" for per-process)
    detail: str  # why per-process: what each cgroup kind lacked ("" with a cgroup)

    def describe(self) -> str:
        """One line for the log and ``megatron-rl info``."""
        if self.kind == "per-process":
            return (
                "per process only (RLIMIT_AS = memory_mb each; a sandbox may use up to "
                f"max_procs x memory_mb): {self.detail}"
            )
        return (
            f"per sandbox: {self.kind} memory cgroup under {self.parent} (all of a sandbox's "
            "processes and tmpfs files <= memory_mb)"
        )


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def _write(directory: str, name: str, value: str) -> None:
    with open(os.path.join(directory, name), "w", encoding="utf-8") as f:
        f.write(value)


def parse_mounts(mountinfo: str) -> list[tuple[str, str, str, set[str]]]:
    """(root, mount point, fs type, options) of each cgroup mount in a mountinfo text."""
    mounts = []
    for line in mountinfo.splitlines():
        fields = line.split()
        if "-" not in fields[6:]:
            continue
        sep = fields.index("-", 6)
        fstype = fields[sep + 1]
        if fstype in ("cgroup", "cgroup2"):
            opts = set(fields[5].split(",")) | set(fields[sep + 3].split(","))
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
            mounts.append((fields[3], point, fstype, opts))
    return mounts


def parse_own(cgroups: str) -> dict[str, str]:
    """Controller -> this process's cgroup path, from /proc/self/cgroup ("" = the v2 one)."""
    own = {}
    for line in cgroups.splitlines():
        _, controllers, path = line.split(":", 2)
        for name in controllers.split(",") if controllers else [""]:
            own[name] = path
    return own


def _join(root: str, point: str, path: str) -> str:
    if root != "/" and (path == root or path.startswith(root + "/")):
        path = path[len(root) :]
    return os.path.join(point, path.lstrip("/"))


def find_parent(kind: str, mountinfo: str, cgroups: str) -> tuple[str | None, str]:
    """The directory of this process's cgroup for ``kind``, or None and why there is none."""
    own = parse_own(cgroups)
    for root, point, fstype, opts in parse_mounts(mountinfo):
        if kind == "cgroup-v1" and fstype == "cgroup" and "memory" in opts and "memory" in own:
            return _join(root, point, own["memory"]), ""
        if kind == "cgroup-v2" and fstype == "cgroup2" and "" in own:
            parent = _join(root, point, own[""])
            return _v2_delegated(parent)
    return None, f"{kind}: no such memory controller mounted"


def _v2_delegated(parent: str) -> tuple[str | None, str]:
    try:
        if "memory" not in _read(os.path.join(parent, "cgroup.controllers")).split():
            return None, f"cgroup-v2: the memory controller is not available at {parent}"
        if "memory" not in _read(os.path.join(parent, "cgroup.subtree_control")).split():
            _write(parent, "cgroup.subtree_control", "+memory")
    except OSError as e:
        return None, f"cgroup-v2: memory is not delegated to child cgroups of {parent} ({e})"
    return parent, ""


def _probe(kind: str, parent: str) -> str:
    """Make, limit and remove a test cgroup under ``parent``; "" when that works, else why not."""
    try:
        group = SandboxCgroup(MemoryBound(kind, parent, ""), 64, name=f"{PREFIX}-{os.getpid()}-p")
    except OSError as e:
        return f"{kind}: cannot make a cgroup under {parent} ({e})"
    group.remove()
    return ""


def remove_stale(parent: str) -> None:
    """Remove the empty sandbox cgroups of host processes that no longer exist."""
    try:
        entries = os.listdir(parent)
    except OSError:
        return
    for entry in entries:
        match = re.fullmatch(rf"{PREFIX}-(\d+)-\w+", entry)
        if match and not os.path.exists(f"/proc/{match.group(1)}"):
            try:
                os.rmdir(os.path.join(parent, entry))
            except OSError:
                pass  # still holds a process: not stale after all


@functools.cache
def detect() -> MemoryBound:
    """The bound sandboxes get in this process (decided, and logged, once)."""
    try:
        mountinfo, cgroups = _read("/proc/self/mountinfo"), _read("/proc/self/cgroup")
    except OSError as e:
        mountinfo, cgroups = "", ""
        log.debug("cannot read this process's cgroups: %s", e)
    reasons = []
    for kind in ("cgroup-v2", "cgroup-v1"):
        parent, why = find_parent(kind, mountinfo, cgroups)
        if parent is not None:
            why = _probe(kind, parent)
            if not why:
                remove_stale(parent)
                bound = MemoryBound(kind, parent, "")
                log.info("sandbox memory bound: %s", bound.describe())
                return bound
        reasons.append(why)
    bound = MemoryBound("per-process", "", "; ".join(reasons))
    log.warning("sandbox memory bound: %s", bound.describe())
    return bound


class SandboxCgroup:
    """One sandbox's memory cgroup: made with its limit, given bwrap, removed once empty."""

    def __init__(self, bound: MemoryBound, limit_mb: int, name: str | None = None) -> None:
        if bound.kind not in _LIMIT_FILES:
            raise ValueError(f"no cgroup for memory bound {bound.kind!r}")
        self.kind = bound.kind
        name = name or f"{PREFIX}-{os.getpid()}-{next(_counter)}"
        self.path = os.path.join(bound.parent, name)  # the cgroup's directory
        os.mkdir(self.path)
        try:
            ram, swap, _ = _LIMIT_FILES[self.kind]
            _write(self.path, ram, str(limit_mb << 20))
            if os.path.exists(os.path.join(self.path, swap)):  # v1: RAM + swap; v2: swap alone
                _write(self.path, swap, str(limit_mb << 20) if self.kind == "cgroup-v1" else "0")
        except BaseException:
            os.rmdir(self.path)
            raise

    def add(self, pid: int) -> None:
        """Move process ``pid`` in (its later children are born inside)."""
        _write(self.path, "cgroup.procs", str(pid))

    def oom_kills(self) -> int:
        """Processes the kernel killed for going over the limit so far."""
        try:
            text = _read(os.path.join(self.path, _LIMIT_FILES[self.kind][2]))
        except OSError:
            return 0
        match = re.search(r"^oom_kill (\d+)$", text, re.MULTILINE)
        return int(match.group(1)) if match else 0

    def remove(self, wait_s: float = 2.0) -> None:
        """Remove the cgroup, waiting up to ``wait_s`` for its last exiting process to leave."""
        deadline = time.monotonic() + wait_s
        while True:
            try:
                os.rmdir(self.path)
                return
            except FileNotFoundError:
                return
            except OSError as e:
                if time.monotonic() > deadline:
                    log.warning("cannot remove sandbox cgroup %s: %s", self.path, e)
                    return
                time.sleep(0.005)
