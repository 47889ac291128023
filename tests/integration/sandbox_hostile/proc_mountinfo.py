# expect: failed
# Read the mount tables: bind mounts name their host source directory in mountinfo.
import os
import re

MARKER = re.compile(rb"mrlhostmark[0-9a-f]{16}")  # the host's markers: prefix + 64 random bits
read = 0


def scan(label, data):
    for hit in MARKER.finditer(data):
        print("FOUND", label, data[hit.start() : hit.start() + 64])


paths = ["/proc/mounts"]
for pid in ["self", "thread-self"] + sorted(p for p in os.listdir("/proc") if p.isdigit()):
    paths += [f"/proc/{pid}/{name}" for name in ("mountinfo", "mounts", "mountstats")]
for path in paths:
    try:
        with open(path, "rb") as f:
            data = f.read()
        read += 1
        scan(path, data)
    except OSError as e:
        print("blocked", path, e.errno)
with open("/proc/self/mountinfo") as f:
    for line in f:
        fields = line.split()
        print("mount", fields[4], "from", fields[3], fields[fields.index("-") + 1 :])
print("read", read)


def oracle(n):
    return 0
