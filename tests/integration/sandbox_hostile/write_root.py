# expect: failed
# Write into the sandbox's root and /dev (tmpfs mounts with no size limit unless read-only).
written = 0
for path in ("/fill", "/dev/fill", "/harness/fill", "/data/fill"):
    try:
        with open(path, "wb") as f:
            for _ in range(8):
                f.write(b"\0" * (1 << 20))
                written += 1
        print("wrote", path)
    except OSError as e:
        print("blocked", path, e.errno)
print("MiB written outside the size-limited mounts:", written)


def oracle(n):
    return 13
