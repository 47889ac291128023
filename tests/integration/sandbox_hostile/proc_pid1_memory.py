# expect: failed
# Read the memory of bwrap's init (pid 1): its stack holds the environment and arguments it was
# started with, its heap what it parsed while building the sandbox.
import os
import re

MARKER = re.compile(rb"mrlhostmark[0-9a-f]{16}")  # the host's markers: prefix + 64 random bits
read = 0


def scan(label, data):
    for hit in MARKER.finditer(data):
        print("FOUND", label, data[hit.start() : hit.start() + 64])


for pid in sorted(p for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()):
    try:
        with open(f"/proc/{pid}/maps") as f:
            regions = [line.split()[:2] for line in f]
        mem = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
    except OSError as e:
        print("blocked", pid, e.errno)
        continue
    for span, perms in regions:
        start, end = (int(x, 16) for x in span.split("-"))
        if "r" not in perms or end - start > 64 << 20:
            continue
        try:
            scan(f"/proc/{pid}/mem {span}", os.pread(mem, end - start, start))
            read += 1
        except OSError:
            pass
    os.close(mem)
for link in ("cwd", "root", "exe"):
    try:
        print(link, os.readlink(f"/proc/1/{link}"), os.listdir(f"/proc/1/{link}")[:20])
    except OSError as e:
        print("blocked", link, e.errno)
print("read", read)


def oracle(n):
    return 0
