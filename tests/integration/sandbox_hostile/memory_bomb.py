# expect: oom
# Allocate far more than the memory limit at once.
blob = bytearray(8 << 30)


def oracle(n):
    return len(blob)
