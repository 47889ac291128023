"""The seccomp filter every sandboxed process runs under, written as classic BPF by hand.

bwrap loads it (``--seccomp FD``: an array of ``struct sock_filter``) as the last step before it
executes the sandbox's command, and into its own pid-1 init; the kernel keeps it across fork,
clone and exec and never lets a process remove it, so the program and everything it starts are
bound by it. After loading it bwrap only writes a status byte and executes the command, and its
init only waits and exits (bubblewrap 0.8.0, ``bubblewrap.c``): nothing it still needs is denied.
What it denies, with ``EPERM`` unless said otherwise, so programs fail cleanly:

* new namespaces: ``unshare`` and ``setns`` always; ``clone`` whose flags (its first argument)
  hold any ``CLONE_NEW*`` bit. ``clone3`` takes its flags in memory, which a filter cannot read,
  so it fails with ``ENOSYS`` and libc falls back to ``clone`` (as Flatpak and Docker do). A user
  namespace is where the sandbox would get every capability back (issue 52: ``unshare(CLONE_NEWUSER
  | CLONE_NEWNET)`` returned 0 and nf_tables answered), the surface behind most recent kernel
  privilege escalations; bwrap's ``--disable-userns`` closes the same door a second way;
* mounts: ``mount``, ``umount2``, ``pivot_root`` and the new mount API (``open_tree``,
  ``open_tree_attr``, ``move_mount``, ``fsopen``, ``fsconfig``, ``fsmount``, ``fspick``,
  ``mount_setattr``);
* looking into other processes: ``ptrace``, ``process_vm_readv``, ``process_vm_writev``,
  ``pidfd_getfd``;
* kernel surfaces no test program needs and exploits favour: ``bpf``, ``perf_event_open``,
  ``userfaultfd``, the keyring calls (``keyctl``, ``add_key``, ``request_key``) and io_uring
  (``io_uring_setup``, ``io_uring_enter``, ``io_uring_register``: its operations bypass seccomp);
  and ``syslog``, the host's kernel log where ``kernel.dmesg_restrict`` is 0;
* netlink sockets other than ``NETLINK_ROUTE`` (which libc uses to list interfaces): netfilter,
  xfrm, audit, generic netlink and the rest reach kernel code that needs no test program.

The first instructions check the architecture: a system call made for another ABI (``int 0x80``
on x86_64, AArch32 on aarch64) kills the process, since its numbers mean other calls; x32 calls
on x86_64 (numbers with bit 30 set) are denied. Only x86_64 and aarch64 are supported; elsewhere
``for_machine`` raises and the sandbox reports itself unavailable.

Classic BPF reads ``struct seccomp_data``: ``nr`` (int) at 0, ``arch`` at 4, the instruction
pointer at 8 and ``args[i]`` (u64) at 16 + 8i; both supported ABIs are little-endian, so the low
32 bits of ``args[i]`` are at 16 + 8i. The flags and socket arguments checked are ints (``clone``
itself reads only the low 32 bits of its flags).
"""

from __future__ import annotations

import errno
import struct

# struct sock_filter { __u16 code; __u8 jt; __u8 jf; __u32 k; }
INSN = struct.Struct("=HBBI")
LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS: A = 32-bit word at offset k of seccomp_data
JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K: pc += (A == k) ? jt : jf
JGE_K = 0x35  # BPF_JMP | BPF_JGE | BPF_K: pc += (A >= k) ? jt : jf
JSET_K = 0x45  # BPF_JMP | BPF_JSET | BPF_K: pc += (A & k) ? jt : jf
RET_K = 0x06  # BPF_RET | BPF_K: return k
OFF_NR, OFF_ARCH = 0, 4  # offsets in struct seccomp_data
OFF_ARGS = 16  # args[i] at OFF_ARGS + 8 * i (its low 32 bits, on little-endian ABIs)

RET_KILL_PROCESS = 0x80000000
RET_ERRNO = 0x00050000  # | errno in the low 16 bits
RET_ALLOW = 0x7FFF0000
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}  # AUDIT_ARCH_X86_64 / _AARCH64
X32_SYSCALL_BIT = 0x40000000  # x86_64: numbers at or above it are x32 calls
CLONE_NEW = {  # the namespace flags of clone(2) (CLONE_NEWTIME shares its bit with CSIGNAL there)
    "CLONE_NEWNS": 0x00020000,
    "CLONE_NEWCGROUP": 0x02000000,
    "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000,
    "CLONE_NEWUSER": 0x10000000,
    "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
}
CLONE_NEW_MASK = sum(CLONE_NEW.values())
AF_NETLINK = 16
NETLINK_ROUTE = 0  # the one netlink protocol allowed

# System call numbers (arch/x86/entry/syscalls/syscall_64.tbl; aarch64 uses the generic table,
# include/uapi/asm-generic/unistd.h). The calls from 424 on share one number on every arch.
SYSCALLS: dict[str, dict[str, int]] = {
    "x86_64": {
        "clone": 56,
        "socket": 41,
        "unshare": 272,
        "setns": 308,
        "mount": 165,
        "umount2": 166,
        "pivot_root": 155,
        "ptrace": 101,
        "process_vm_readv": 310,
        "process_vm_writev": 311,
        "bpf": 321,
        "perf_event_open": 298,
        "userfaultfd": 323,
        "keyctl": 250,
        "add_key": 248,
        "request_key": 249,
        "syslog": 103,
    },
    "aarch64": {
        "clone": 220,
        "socket": 198,
        "unshare": 97,
        "setns": 268,
        "mount": 40,
        "umount2": 39,
        "pivot_root": 41,
        "ptrace": 117,
        "process_vm_readv": 270,
        "process_vm_writev": 271,
        "bpf": 280,
        "perf_event_open": 241,
        "userfaultfd": 282,
        "keyctl": 219,
        "add_key": 217,
        "request_key": 218,
        "syslog": 116,
    },
}
COMMON = {  # the same number on both
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "open_tree": 428,
    "move_mount": 429,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "fspick": 433,
    "clone3": 435,
    "pidfd_getfd": 438,
    "mount_setattr": 442,
    "open_tree_attr": 467,
}
DENIED = (  # always EPERM, whatever the arguments
    *("unshare", "setns"),
    *("mount", "umount2", "pivot_root", "open_tree", "open_tree_attr", "move_mount"),
    *("fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr"),
    *("ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd"),
    *("bpf", "perf_event_open", "userfaultfd", "keyctl", "add_key", "request_key", "syslog"),
    *("io_uring_setup", "io_uring_enter", "io_uring_register"),
)
ENOSYS_CALLS = ("clone3",)  # fail as if the kernel lacked them: libc falls back to clone


def numbers(machine: str) -> dict[str, int]:
    """Name -> system call number on ``machine`` (``platform.machine()`` spelling)."""
    if machine not in SYSCALLS:
        raise ValueError(f"no seccomp filter for {machine!r}; supported: {sorted(SYSCALLS)}")
    return {**SYSCALLS[machine], **COMMON}


Jump = int | str  # 0 (the next instruction) or a label
Line = tuple[int, int] | tuple[int, int, Jump, Jump] | str  # (code, k[, jt, jf]) or a label
Insn = tuple[int, int, int, int]  # code, jt, jf, k as in struct sock_filter


def _assemble(lines: list[Line]) -> list[Insn]:
    """Resolve the lines' jumps to labels (``str`` lines) into forward offsets."""
    at: dict[str, int] = {}
    n = 0
    for line in lines:
        if isinstance(line, str):
            at[line] = n
        else:
            n += 1
    out: list[Insn] = []
    for line in lines:
        if isinstance(line, str):
            continue
        code, k, *jumps = line
        offsets = []
        for target in jumps or [0, 0]:
            off = at[target] - len(out) - 1 if isinstance(target, str) else target
            assert 0 <= off <= 255, (line, off)  # classic BPF jumps forward, 8-bit offsets
            offsets.append(off)
        out.append((code, offsets[0], offsets[1], k))
    return out


def program(machine: str) -> list[Insn]:
    """The filter for ``machine`` as ``(code, jt, jf, k)`` instructions."""
    nr = numbers(machine)
    lines: list[Line] = [
        (LD_W_ABS, OFF_ARCH),
        (JEQ_K, AUDIT_ARCH[machine], 0, "kill"),
        (LD_W_ABS, OFF_NR),
    ]
    if machine == "x86_64":
        lines.append((JGE_K, X32_SYSCALL_BIT, "deny", 0))
    lines += [(JEQ_K, nr[name], "deny", 0) for name in DENIED]
    lines += [(JEQ_K, nr[name], "enosys", 0) for name in ENOSYS_CALLS]
    lines += [
        (JEQ_K, nr["clone"], "clone", 0),
        (JEQ_K, nr["socket"], "socket", 0),
        (RET_K, RET_ALLOW),
        "clone",
        (LD_W_ABS, OFF_ARGS),  # args[0]: flags
        (JSET_K, CLONE_NEW_MASK, "deny", "allow"),
        "socket",
        (LD_W_ABS, OFF_ARGS),  # args[0]: domain
        (JEQ_K, AF_NETLINK, 0, "allow"),
        (LD_W_ABS, OFF_ARGS + 16),  # args[2]: protocol
        (JEQ_K, NETLINK_ROUTE, "allow", "deny"),
        "allow",
        (RET_K, RET_ALLOW),
        "deny",
        (RET_K, RET_ERRNO | errno.EPERM),
        "enosys",
        (RET_K, RET_ERRNO | errno.ENOSYS),
        "kill",
        (RET_K, RET_KILL_PROCESS),
    ]
    return _assemble(lines)


def for_machine(machine: str) -> bytes:
    """The compiled filter for ``machine``: what bwrap's ``--seccomp FD`` reads."""
    return b"".join(INSN.pack(*insn) for insn in program(machine))
