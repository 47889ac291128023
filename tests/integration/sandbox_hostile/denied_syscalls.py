# expect: failed
# blocked: ptrace_traceme, ptrace_attach_child, process_vm_readv, bpf_map_create, keyctl_session
# blocked: add_key, request_key, perf_event_open, userfaultfd, io_uring_setup, fsopen, fsmount
# blocked: fsconfig, fspick, open_tree, move_mount, mount_setattr, pidfd_getfd, syslog_read_all
# The kernel surfaces a sandboxed program has no use for and exploits favour: tracing, eBPF,
# keyrings, perf events, userfaultfd, io_uring, the new mount API, another process's fds and the
# kernel log. Each call is made the way a working program would make it, so only the filter
# stands between it and success.
import ctypes
import errno
import os
import struct
import subprocess
import sys

NR = {
    "x86_64": {"ptrace": 101, "process_vm_readv": 310, "bpf": 321, "keyctl": 250,
               "add_key": 248, "request_key": 249, "perf_event_open": 298, "userfaultfd": 323,
               "syslog": 103},
    "aarch64": {"ptrace": 117, "process_vm_readv": 270, "bpf": 280, "keyctl": 219,
                "add_key": 217, "request_key": 218, "perf_event_open": 241, "userfaultfd": 282,
                "syslog": 116},
}[os.uname().machine]  # fmt: skip
NR.update(io_uring_setup=425, open_tree=428, move_mount=429, fsopen=430, fsconfig=431,
          fsmount=432, fspick=433, pidfd_getfd=438, mount_setattr=442)  # fmt: skip
AT_FDCWD = ctypes.c_int(-100)
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long


def report(name, ok, err):
    print(f"ESCAPED {name}" if ok else f"blocked {name} {errno.errorcode.get(err, err)}")


def call(name, label, *args):
    ctypes.set_errno(0)
    res = libc.syscall(NR[name], *(ctypes.c_long(a) if isinstance(a, int) else a for a in args))
    report(label, res >= 0, ctypes.get_errno())
    return res


def zeroed(n):
    return ctypes.create_string_buffer(n)


pid = os.fork()  # PTRACE_TRACEME in a child, so a success cannot leave this process traced
if pid == 0:
    ctypes.set_errno(0)
    os._exit(0 if libc.syscall(NR["ptrace"], 0, 0, 0, 0) == 0 else 100 + ctypes.get_errno())
status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
report("ptrace_traceme", status == 0, status - 100)
sleeper = subprocess.Popen([sys.executable, "-I", "-S", "-c", "import time; time.sleep(30)"])
if call("ptrace", "ptrace_attach_child", 16, sleeper.pid, 0, 0) == 0:  # PTRACE_ATTACH
    libc.syscall(NR["ptrace"], 17, sleeper.pid, 0, 0)  # PTRACE_DETACH
pidfd = os.pidfd_open(sleeper.pid)
if call("pidfd_getfd", "pidfd_getfd", pidfd, 1, 0) >= 0:  # the child's stdout
    print("took the child's fd 1")
os.close(pidfd)
sleeper.kill()
sleeper.wait()
src, dst = ctypes.create_string_buffer(b"secret", 8), zeroed(8)
local = struct.pack("=QQ", ctypes.addressof(dst), 8)
remote = struct.pack("=QQ", ctypes.addressof(src), 8)
call("process_vm_readv", "process_vm_readv", os.getpid(), local, 1, remote, 1, 0)
call("bpf", "bpf_map_create", 0, struct.pack("=IIII", 2, 4, 4, 1) + bytes(56), 72)
call("keyctl", "keyctl_session", 0, ctypes.c_int(-3), 0)  # KEYCTL_GET_KEYRING_ID, session
call("add_key", "add_key", b"user", b"mrl-hostile", b"x", 1, ctypes.c_int(-2))
call("request_key", "request_key", b"user", b"mrl-hostile", None, 0)
attr = bytearray(128)  # software CPU clock on this process, user space only
struct.pack_into("=IIQ", attr, 0, 1, 128, 0)
struct.pack_into("=Q", attr, 40, 1 | 1 << 5 | 1 << 6)  # disabled, exclude_kernel, exclude_hv
call("perf_event_open", "perf_event_open", bytes(attr), 0, -1, -1, 0)
call("userfaultfd", "userfaultfd", 1 | os.O_CLOEXEC)  # UFFD_USER_MODE_ONLY
call("syslog", "syslog_read_all", 3, zeroed(4096), 4096)  # SYSLOG_ACTION_READ_ALL
call("io_uring_setup", "io_uring_setup", 1, zeroed(120))
call("fsopen", "fsopen", b"tmpfs", 0)
call("fsmount", "fsmount", -1, 0, 0)
call("fsconfig", "fsconfig", -1, 0, None, None, 0)
call("fspick", "fspick", AT_FDCWD, b"/tmp", 0)
call("open_tree", "open_tree", AT_FDCWD, b"/tmp", 1)  # OPEN_TREE_CLONE
call("move_mount", "move_mount", AT_FDCWD, b"/tmp", AT_FDCWD, b"/work", 0)
call("mount_setattr", "mount_setattr", AT_FDCWD, b"/tmp", 0, zeroed(32), 32)


def oracle(n):
    return 0
