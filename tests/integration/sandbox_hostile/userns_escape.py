# expect: failed
# blocked: unshare_user, unshare_user_net, clone_newuser, clone_newnet, clone_newns, clone_newpid
# blocked: clone_newipc, clone_newuts, clone_newcgroup, clone3_newuser:ENOSYS, setns_user
# blocked: setns_net, netlink_netfilter
# Get a user namespace (and with it every capability) by unshare, clone, clone3 or setns, then
# reach nf_tables through a NETLINK_NETFILTER socket, the surface of many kernel escalations.
import ctypes
import errno
import os
import signal
import socket
import struct

MACHINE = os.uname().machine
NR = {
    "x86_64": {"unshare": 272, "clone": 56, "clone3": 435, "setns": 308},
    "aarch64": {"unshare": 97, "clone": 220, "clone3": 435, "setns": 268},
}[MACHINE]
NEW = {"newns": 0x20000, "newcgroup": 0x2000000, "newuts": 0x4000000, "newipc": 0x8000000,
       "newuser": 0x10000000, "newpid": 0x20000000, "newnet": 0x40000000}  # fmt: skip
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long


def report(name, ok, err, detail=""):
    print(f"ESCAPED {name} {detail}" if ok else f"blocked {name} {errno.errorcode.get(err, err)}")


def raw(nr, *args):
    ctypes.set_errno(0)
    res = libc.syscall(nr, *(ctypes.c_long(a) if isinstance(a, int) else a for a in args))
    return res, ctypes.get_errno()


def reap(res):
    """A raw clone that worked returns 0 in the new process: leave at once, reap it here."""
    if res == 0:
        os._exit(0)
    if res > 0:
        os.waitpid(res, 0)


for name, flags in (("unshare_user", NEW["newuser"]),
                    ("unshare_user_net", NEW["newuser"] | NEW["newnet"])):  # fmt: skip
    res, err = raw(NR["unshare"], flags)
    report(name, res == 0, err)
for flag, bit in NEW.items():
    res, err = raw(NR["clone"], ctypes.c_ulong(bit | signal.SIGCHLD), 0, 0, 0, 0)
    reap(res)
    report(f"clone_{flag}", res >= 0, err)
args = struct.pack("=11Q", NEW["newuser"], 0, 0, 0, signal.SIGCHLD, 0, 0, 0, 0, 0, 0)
buf = ctypes.create_string_buffer(args, len(args))
res, err = raw(NR["clone3"], buf, ctypes.c_size_t(len(args)))
reap(res)
report("clone3_newuser", res >= 0, err)
for kind, nstype in (("user", NEW["newuser"]), ("net", NEW["newnet"])):
    try:
        fd = os.open(f"/proc/self/ns/{kind}", os.O_RDONLY)
    except OSError:
        fd = -1
    res, err = raw(NR["setns"], fd, nstype)
    report(f"setns_{kind}", res == 0, err)
if MACHINE == "x86_64":  # the x32 ABI's unshare (bit 30 set): the filter must not miss it
    res, err = raw(0x40000000 | NR["unshare"], NEW["newuser"])
    report("x32_unshare_user", res == 0, err)
try:
    nl = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 12)  # NETLINK_NETFILTER
except OSError as e:
    report("netlink_netfilter", False, e.errno)
else:
    # NFT_MSG_GETTABLE dump (NFNL_SUBSYS_NFTABLES << 8 | 1): answered only with CAP_NET_ADMIN
    nl.send(struct.pack("=IHHIIBBH", 20, (10 << 8) | 1, 0x301, 1, 0, 2, 0, 0))
    kind = struct.unpack_from("=IH", nl.recv(65536))[1]
    report("netlink_netfilter", True, 0, f"socket opened, nf_tables answered type {kind}")
try:
    socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0).close()  # NETLINK_ROUTE: libc's own
    print("allowed netlink_route")
except OSError as e:
    print("netlink_route", e.errno)


def oracle(n):
    return 0
