# expect: failed,error
# Fill every writable file system.
for path in ("/work/fill", "/tmp/fill", "/dev/shm/fill"):
    try:
        with open(path, "wb") as f:
            while True:
                f.write(b"\0" * (1 << 20))
    except OSError as e:
        print("stopped", path, e)


def oracle(n):
    return 12
