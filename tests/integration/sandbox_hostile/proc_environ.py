# expect: failed
# Read the environment of every process it can see (pid 1 is bwrap, which the host started).
import os
import re

MARKER = re.compile(rb"mrlhostmark[0-9a-f]{16}")  # the host's markers: prefix + 64 random bits
read = 0


def scan(label, data):
    for hit in MARKER.finditer(data):
        print("FOUND", label, data[hit.start() : hit.start() + 64])


for pid in sorted(p for p in os.listdir("/proc") if p.isdigit()):
    paths = [f"/proc/{pid}/environ"]
    try:
        paths += [f"/proc/{pid}/task/{t}/environ" for t in os.listdir(f"/proc/{pid}/task")]
    except OSError as e:
        print("blocked", pid, "task", e.errno)
    for path in paths:
        try:
            with open(path, "rb") as f:
                scan(path, f.read())
            read += 1
        except OSError as e:
            print("blocked", path, e.errno)
scan("os.environ", repr(dict(os.environ)).encode())
print("read", read)


def oracle(n):
    return 0
