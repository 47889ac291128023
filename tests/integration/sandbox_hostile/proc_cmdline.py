# expect: failed
# Read the command line, name and status of every process it can see, and the kernel's.
import os
import re

MARKER = re.compile(rb"mrlhostmark[0-9a-f]{16}")  # the host's markers: prefix + 64 random bits
read = 0


def scan(label, data):
    for hit in MARKER.finditer(data):
        print("FOUND", label, data[hit.start() : hit.start() + 64])


paths = ["/proc/cmdline", "/proc/self/cmdline"]
for pid in sorted(p for p in os.listdir("/proc") if p.isdigit()):
    tasks = [f"/proc/{pid}"]
    try:
        tasks += [f"/proc/{pid}/task/{t}" for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        pass
    for task in tasks:
        paths += [f"{task}/{name}" for name in ("cmdline", "comm", "status", "stat", "sched")]
for path in paths:
    try:
        with open(path, "rb") as f:
            data = f.read()
        read += 1
        scan(path, data)
        if path.endswith("/cmdline"):
            print(path, data.replace(b"\0", b" ")[:300])
    except OSError as e:
        print("blocked", path, e.errno)
print("read", read)


def oracle(n):
    return 0
