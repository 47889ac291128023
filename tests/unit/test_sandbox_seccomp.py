"""The sandbox's seccomp filter, run through a small classic-BPF interpreter written here.

The interpreter executes the compiled bytes (what bwrap hands the kernel) against synthetic
``struct seccomp_data`` for allowed and denied calls on x86_64 and aarch64. Opcodes, return
values and the system call numbers below are copied from the kernel's headers and tables
(linux/filter.h, linux/seccomp.h, syscall_64.tbl, asm-generic/unistd.h), not from the module, so
a wrong number in the module fails here. The live kernel side (the filter in a real sandbox) is
tests/integration/test_sandbox_hostile.py.
"""

from __future__ import annotations

import errno
import platform
import re
import struct
from pathlib import Path

import pytest

from megatron_rl.sandbox import isolation, seccomp
from megatron_rl.sandbox.result import SandboxUnavailable

ALLOW, KILL = 0x7FFF0000, 0x80000000
EPERM, ENOSYS = 0x00050000 | errno.EPERM, 0x00050000 | errno.ENOSYS
ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
OTHER_ABI = {"x86_64": 0x40000003, "aarch64": 0x40000028}  # AUDIT_ARCH_I386, AUDIT_ARCH_ARM
MACHINES = ("x86_64", "aarch64")
# name -> (x86_64, aarch64)
DENIED = {
    "unshare": (272, 97),
    "setns": (308, 268),
    "mount": (165, 40),
    "umount2": (166, 39),
    "pivot_root": (155, 41),
    "open_tree": (428, 428),
    "move_mount": (429, 429),
    "fsopen": (430, 430),
    "fsconfig": (431, 431),
    "fsmount": (432, 432),
    "fspick": (433, 433),
    "mount_setattr": (442, 442),
    "open_tree_attr": (467, 467),
    "ptrace": (101, 117),
    "process_vm_readv": (310, 270),
    "process_vm_writev": (311, 271),
    "pidfd_getfd": (438, 438),
    "syslog": (103, 116),
    "bpf": (321, 280),
    "perf_event_open": (298, 241),
    "userfaultfd": (323, 282),
    "keyctl": (250, 219),
    "add_key": (248, 217),
    "request_key": (249, 218),
    "io_uring_setup": (425, 425),
    "io_uring_enter": (426, 426),
    "io_uring_register": (427, 427),
}
ALLOWED = {  # what every Python program makes
    "read": (0, 63),
    "write": (1, 64),
    "openat": (257, 56),
    "mmap": (9, 222),
    "execve": (59, 221),
    "exit_group": (231, 94),
    "wait4": (61, 260),
    "getpid": (39, 172),
    "pidfd_open": (434, 434),  # subprocess may wait on a pidfd
    "landlock_create_ruleset": (444, 444),  # the harness enters a Landlock domain
    "landlock_restrict_self": (446, 446),
}
CLONE, CLONE3, SOCKET = {"x86_64": 56, "aarch64": 220}, 435, {"x86_64": 41, "aarch64": 198}
SIGCHLD = 17
THREAD_FLAGS = 0x003D0F00  # glibc's pthread_create: VM|FS|FILES|SIGHAND|THREAD|SYSVSEM|SETTLS|..
NEW_FLAGS = [0x20000, 0x2000000, 0x4000000, 0x8000000, 0x10000000, 0x20000000, 0x40000000]


def run_filter(prog: bytes, nr: int, arch: int, args: tuple[int, ...] = ()) -> int:
    """Execute classic BPF ``prog`` on one ``struct seccomp_data``; the action it returns."""
    assert len(prog) % 8 == 0 and 0 < len(prog) // 8 <= 4096  # BPF_MAXINSNS
    insns = [struct.unpack_from("=HBBI", prog, i) for i in range(0, len(prog), 8)]
    full = (*args, *[0] * (6 - len(args)))
    data = struct.pack("=IIQ6Q", nr & 0xFFFFFFFF, arch, 0x401000, *full)
    pc, acc = 0, 0
    while True:
        assert 0 <= pc < len(insns), f"fell off the program at {pc}"
        code, jt, jf, k = insns[pc]
        if code == 0x20:  # BPF_LD | BPF_W | BPF_ABS
            assert k % 4 == 0 and k + 4 <= len(data), k
            acc = struct.unpack_from("=I", data, k)[0]
        elif code == 0x15:  # BPF_JMP | BPF_JEQ | BPF_K
            pc += jt if acc == k else jf
        elif code == 0x35:  # BPF_JMP | BPF_JGE | BPF_K
            pc += jt if acc >= k else jf
        elif code == 0x45:  # BPF_JMP | BPF_JSET | BPF_K
            pc += jt if acc & k else jf
        elif code == 0x05:  # BPF_JMP | BPF_JA
            pc += k
        elif code == 0x06:  # BPF_RET | BPF_K
            return int(k)
        else:
            raise AssertionError(f"opcode {code:#x} at {pc} is not one this interpreter knows")
        pc += 1


@pytest.fixture(params=MACHINES)
def machine(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def verdict(machine: str, nr: int, *args: int, arch: int | None = None) -> int:
    prog = seccomp.for_machine(machine)
    return run_filter(prog, nr, ARCH[machine] if arch is None else arch, args)


def test_denied_calls_return_eperm(machine: str) -> None:
    col = MACHINES.index(machine)
    got = {name: verdict(machine, nrs[col], 0, 0, 0) for name, nrs in DENIED.items()}
    assert got == dict.fromkeys(DENIED, EPERM)


def test_ordinary_calls_are_allowed(machine: str) -> None:
    col = MACHINES.index(machine)
    got = {name: verdict(machine, nrs[col], 3, 4, 5) for name, nrs in ALLOWED.items()}
    assert got == dict.fromkeys(ALLOWED, ALLOW)


def test_clone_with_a_namespace_flag_is_denied_and_forks_and_threads_are_not(machine: str) -> None:
    nr = CLONE[machine]
    assert [verdict(machine, nr, flag | SIGCHLD) for flag in NEW_FLAGS] == [EPERM] * 7
    assert verdict(machine, nr, 0x10000000 | THREAD_FLAGS) == EPERM
    assert verdict(machine, nr, 0x10000000 | 1 << 40) == EPERM  # high word ignored by clone
    assert verdict(machine, nr, SIGCHLD) == ALLOW  # fork
    assert verdict(machine, nr, 0x4000 | 0x100 | SIGCHLD) == ALLOW  # vfork: VFORK|VM
    assert verdict(machine, nr, THREAD_FLAGS) == ALLOW
    assert verdict(machine, nr, 1 << 32 | SIGCHLD) == ALLOW  # clone reads only the low word


def test_clone3_is_enosys_so_libc_falls_back_to_clone(machine: str) -> None:
    assert verdict(machine, CLONE3, 0x7FFF0000, 88) == ENOSYS
    assert verdict(machine, CLONE3, 0, 0) == ENOSYS


def test_only_routing_netlink_sockets(machine: str) -> None:
    nr = SOCKET[machine]
    af_inet, af_unix, af_netlink, sock_raw = 2, 1, 16, 3
    assert verdict(machine, nr, af_inet, 1, 0) == ALLOW
    assert verdict(machine, nr, af_unix, 1 | 0o2000000, 0) == ALLOW  # SOCK_CLOEXEC
    assert verdict(machine, nr, af_netlink, sock_raw, 0) == ALLOW  # NETLINK_ROUTE
    for protocol in (12, 9, 16, 6, 15):  # NETFILTER, AUDIT, GENERIC, XFRM, KOBJECT_UEVENT
        assert verdict(machine, nr, af_netlink, sock_raw, protocol) == EPERM, protocol


def test_other_abis_are_killed_and_x32_denied(machine: str) -> None:
    read = ALLOWED["read"][MACHINES.index(machine)]
    other = next(m for m in MACHINES if m != machine)
    assert verdict(machine, read, arch=OTHER_ABI[machine]) == KILL
    assert verdict(machine, read, arch=ARCH[other]) == KILL
    assert verdict(machine, read, arch=0) == KILL
    if machine == "x86_64":
        assert verdict(machine, 0x40000000 | read) == EPERM  # x32 read
        assert verdict(machine, 0x40000000 | 272, 0x10000000) == EPERM  # x32 unshare
        assert verdict(machine, -1) == EPERM


def test_every_jump_lands_inside_and_every_path_returns() -> None:
    for machine in MACHINES:
        prog = seccomp.for_machine(machine)
        insns = [struct.unpack_from("=HBBI", prog, i) for i in range(0, len(prog), 8)]
        assert insns[-1][0] == 0x06
        for pc, (code, jt, jf, _) in enumerate(insns):
            if code & 0x07 == 0x05:  # BPF_JMP
                assert pc + 1 + max(jt, jf) < len(insns), (machine, pc)


def test_unknown_architecture_has_no_sandbox(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="riscv64"):
        seccomp.for_machine("riscv64")
    monkeypatch.setattr(platform, "machine", lambda: "riscv64")
    with pytest.raises(SandboxUnavailable, match="riscv64"):
        isolation.seccomp_filter.__wrapped__()


def header_numbers(path: Path) -> dict[str, int]:
    text = path.read_text()
    return {m[1]: int(m[2]) for m in re.finditer(r"#define __NR(?:3264)?_(\w+)\s+(\d+)\b", text)}


@pytest.mark.parametrize(
    ("machine", "header"),
    [
        ("x86_64", "/usr/include/x86_64-linux-gnu/asm/unistd_64.h"),
        ("aarch64", "/usr/include/asm-generic/unistd.h"),
    ],
)
def test_numbers_match_this_machines_kernel_headers(machine: str, header: str) -> None:
    if not Path(header).exists():
        pytest.skip(f"{header} is not installed here")
    known = header_numbers(Path(header))
    ours = seccomp.numbers(machine)
    shared = sorted(set(ours) & set(known))
    assert len(shared) >= len(ours) - 1  # open_tree_attr (6.15) may be newer than the headers
    assert {n: ours[n] for n in shared} == {n: known[n] for n in shared}
