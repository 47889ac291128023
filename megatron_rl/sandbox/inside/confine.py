"""What a harness process does to itself inside the sandbox before any program code runs.

Runs under the system interpreter (stdlib only). Three things:

* ``close_fds_except``: every file descriptor but stdio and the process's own channel is closed,
  so nothing bwrap or the host happened to pass along (the options pipe, a stray fd) is left.
* ``leave_session_keyring``: the process takes a new, empty session keyring, so no key of the
  host can be reached through it. Inside the sandbox this fails with EPERM, and that is fine:
  the seccomp filter (megatron_rl/sandbox/seccomp.py) denies every keyring call
  (``keyctl``, ``add_key``, ``request_key``) to the program too, and the host already forks
  bwrap from a thread holding a fresh, empty session keyring. It does its work in the
  unsandboxed fallback, which has no filter.
* ``enter_landlock``: the process enters a Landlock domain of its own. Landlock lets a process in
  a domain look into (ptrace, ``/proc/PID/mem``, ``environ``, ``fd``, ``cwd``, ``maps``) and,
  from ABI 6, signal only processes of the same domain. bwrap's init (pid 1 of the sandbox)
  started outside it, so the program cannot read that process's memory, which holds what bwrap
  parsed while building the sandbox (the host's mount table among it), nor signal it. The
  domain restricts no file access beyond making device nodes, which no sandbox may do anyway.
  Kernels without Landlock (before 5.13, or not enabled) leave this a no-op: the sandbox then
  relies on bwrap's init holding nothing secret (no host environment, no host paths in its
  arguments), see docs/sandbox.md.
"""

from __future__ import annotations

import os
import struct

SYS_LANDLOCK_CREATE_RULESET = 444  # same number on every architecture (new syscall table)
SYS_LANDLOCK_RESTRICT_SELF = 446
LANDLOCK_CREATE_RULESET_VERSION = 1
ACCESS_FS_MAKE_CHAR = 1 << 6
ACCESS_FS_MAKE_BLOCK = 1 << 11
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0
SCOPE_SIGNAL = 1 << 1
SYS_KEYCTL = {"x86_64": 250, "aarch64": 219}  # keyctl(2) per architecture
KEYCTL_JOIN_SESSION_KEYRING = 1


def close_fds_except(keep: set[int]) -> None:
    """Close every descriptor above 2 that is not in ``keep``."""
    low = 3
    for fd in sorted(k for k in keep if k >= 3):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 1 << 20)


def leave_session_keyring() -> bool:
    """Join a new anonymous session keyring; False when that is not possible here (always in
    the sandbox, whose seccomp filter denies keyctl: see the module docstring)."""
    number = SYS_KEYCTL.get(os.uname().machine)
    try:
        import ctypes
    except ImportError:
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return number is not None and libc.syscall(number, KEYCTL_JOIN_SESSION_KEYRING, None) >= 0


def enter_landlock() -> int:
    """Put this process (and all it will start) in a new Landlock domain; returns the kernel's
    Landlock ABI version, 0 when the kernel has none (nothing changed then)."""
    try:
        import ctypes
    except ImportError:
        return 0
    libc = ctypes.CDLL(None, use_errno=True)
    abi = libc.syscall(SYS_LANDLOCK_CREATE_RULESET, None, 0, LANDLOCK_CREATE_RULESET_VERSION)
    if abi < 1:
        return 0
    fs = ACCESS_FS_MAKE_CHAR | ACCESS_FS_MAKE_BLOCK
    if abi >= 6:
        attr = struct.pack("=QQQ", fs, 0, SCOPE_SIGNAL | SCOPE_ABSTRACT_UNIX_SOCKET)
    elif abi >= 4:
        attr = struct.pack("=QQ", fs, 0)
    else:
        attr = struct.pack("=Q", fs)
    buf = ctypes.create_string_buffer(attr, len(attr))
    ruleset = libc.syscall(SYS_LANDLOCK_CREATE_RULESET, buf, len(attr), 0)
    if ruleset < 0:
        return 0
    try:
        if libc.syscall(SYS_LANDLOCK_RESTRICT_SELF, ruleset, 0) != 0:
            return 0
    finally:
        os.close(ruleset)
    return abi
