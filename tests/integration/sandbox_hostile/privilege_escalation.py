# expect: failed
# blocked: setuid_root:EINVAL, setgid_root:EINVAL, chroot, unshare_user, unshare_user_net
# blocked: unshare_mount, mount_tmpfs, umount2, pivot_root
# Become root, enter new namespaces or mount over the sandbox; every attempt must fail (EPERM;
# EINVAL for setuid/setgid: uid and gid 0 are not even mapped into the sandbox).
import ctypes
import errno
import os

NR = {
    "x86_64": {"unshare": 272, "mount": 165, "umount2": 166, "pivot_root": 155},
    "aarch64": {"unshare": 97, "mount": 40, "umount2": 39, "pivot_root": 41},
}[os.uname().machine]
CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWNET = 0x20000, 0x10000000, 0x40000000
libc = ctypes.CDLL(None, use_errno=True)


def report(name, ok, err):
    print(f"ESCAPED {name}" if ok else f"blocked {name} {errno.errorcode.get(err, err)}")


def raw(name, *args):
    ctypes.set_errno(0)
    res = libc.syscall(NR[name], *(ctypes.c_long(a) if isinstance(a, int) else a for a in args))
    return res, ctypes.get_errno()


def attempt(name, fn):
    try:
        fn()
        report(name, True, 0)
    except OSError as e:
        report(name, False, e.errno)


attempt("setuid_root", lambda: os.setuid(0))
attempt("setgid_root", lambda: os.setgid(0))
attempt("chroot", lambda: os.chroot("/"))
for name, flags in (
    ("unshare_user", CLONE_NEWUSER),
    ("unshare_user_net", CLONE_NEWUSER | CLONE_NEWNET),
    ("unshare_mount", CLONE_NEWNS),
):
    res, err = raw("unshare", flags)
    report(name, res == 0, err)
res, err = raw("mount", b"none", b"/tmp", b"tmpfs", 0, None)
report("mount_tmpfs", res == 0, err)
res, err = raw("umount2", b"/tmp", 2)  # MNT_DETACH
report("umount2", res == 0, err)
res, err = raw("pivot_root", b".", b".")
report("pivot_root", res == 0, err)


def oracle(n):
    return 14
