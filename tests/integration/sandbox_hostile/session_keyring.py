# expect: failed
# Read every key reachable from the session, user and user-session keyrings (a process that
# inherits the host's session keyring may read every key linked to it).
import ctypes
import os
import re

MARKER = re.compile(rb"mrlhostmark[0-9a-f]{16}")  # the host's markers: prefix + 64 random bits
KEYCTL = {"x86_64": 250, "aarch64": 219}.get(os.uname().machine, 250)
DESCRIBE, READ = 6, 11
libc = ctypes.CDLL(None, use_errno=True)
read = 0


def scan(label, data):
    for hit in MARKER.finditer(data):
        print("FOUND", label, data[hit.start() : hit.start() + 64])


def keyctl(op, key):
    buf = ctypes.create_string_buffer(1 << 16)
    n = libc.syscall(KEYCTL, op, key, buf, len(buf))
    return buf.raw[: min(n, len(buf))] if n >= 0 else None


def visit(key, depth=0):
    global read
    desc = keyctl(DESCRIBE, key)
    if desc is None and depth == 0:  # the seccomp filter denies keyctl: EPERM (1)
        print("blocked", key, ctypes.get_errno())
    data = keyctl(READ, key)
    if desc is None:
        return
    read += 1
    print("key", key, desc[:80])
    scan(f"key {key} description", desc)
    if data is None:
        return
    scan(f"key {key} payload", data)
    if desc.startswith(b"keyring;") and depth < 4:
        for i in range(0, len(data) - 3, 4):
            visit(int.from_bytes(data[i : i + 4], "little", signed=True), depth + 1)


for spec in (-3, -4, -5):  # session, user, user-session keyring
    visit(spec)
with open("/proc/keys", "rb") as f:
    scan("/proc/keys", f.read())
print("read", read)


def oracle(n):
    return 0
