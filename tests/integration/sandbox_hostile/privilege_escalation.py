# expect: failed
# Become root, mount the host, or enter another namespace.
import ctypes
import os

for attempt in (
    lambda: os.setuid(0),
    lambda: os.chroot("/"),
    lambda: os.open("/proc/1/ns/net", os.O_RDONLY),
):
    try:
        attempt()
        print("attempt worked")
    except OSError as e:
        print("blocked", e)
libc = ctypes.CDLL(None)
print("unshare", libc.unshare(0x10000000), "mount", libc.mount(b"/", b"/work", None, 4096, None))


def oracle(n):
    return 14
