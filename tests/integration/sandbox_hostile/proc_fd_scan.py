# expect: failed,error
# Look at every open file of every visible process: where it points, and what it holds.
import os
import re

MARKER = re.compile(rb"mrlhostmark[0-9a-f]{16}")  # the host's markers: prefix + 64 random bits
read = 0


def scan(label, data):
    for hit in MARKER.finditer(data):
        print("FOUND", label, data[hit.start() : hit.start() + 64])


for pid in sorted(p for p in os.listdir("/proc") if p.isdigit()):
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError as e:
        print("blocked", pid, "fd", e.errno)
        continue
    for fd in fds:
        path = f"/proc/{pid}/fd/{fd}"
        try:
            target = os.readlink(path)
            print(path, "->", target)
            scan(path, target.encode())
            with open(f"/proc/{pid}/fdinfo/{fd}", "rb") as f:
                scan(path + " fdinfo", f.read())
            read += 1
            if target.startswith(("pipe:", "socket:", "anon_inode:")):
                continue  # reading those would block or steal the harness's messages
            handle = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
            try:
                scan(path + " data", os.pread(handle, 1 << 20, 0))
            finally:
                os.close(handle)
        except OSError as e:
            print("blocked", path, e.errno)
print("read", read)


def oracle(n):
    return 0
