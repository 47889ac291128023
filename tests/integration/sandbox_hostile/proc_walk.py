# expect: failed
# Read every file of /proc that is not a process (kernel tables, /proc/sys), the keys it can
# reach, and every file of its own tree; /sys must not exist at all.
import os
import re

MARKER = re.compile(rb"mrlhostmark[0-9a-f]{16}")  # the host's markers: prefix + 64 random bits
SKIP = {
    "/proc/kmsg",
    "/proc/kcore",
    "/proc/sysrq-trigger",
    "/proc/kpagecount",
    "/proc/kpageflags",
    "/proc/kpagecgroup",
    "/proc/self",
    "/proc/thread-self",
}
read = 0


def scan(label, data):
    for hit in MARKER.finditer(data):
        print("FOUND", label, data[hit.start() : hit.start() + 64])


def read_tree(top):
    global read
    for root, dirs, files in os.walk(top):
        if root == "/proc":
            dirs[:] = [d for d in dirs if not d.isdigit() and f"/proc/{d}" not in SKIP]
        for name in files:
            path = os.path.join(root, name)
            if path in SKIP:
                continue
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
                try:
                    scan(path, os.read(fd, 1 << 18))
                finally:
                    os.close(fd)
                read += 1
            except OSError:
                pass


read_tree("/proc")
for top in ("/data", "/harness", "/work", "/tmp", "/dev/shm"):
    read_tree(top)
print("sys exists:", os.path.exists("/sys"), "etc exists:", os.path.exists("/etc"))
print("read", read)


def oracle(n):
    return 0
