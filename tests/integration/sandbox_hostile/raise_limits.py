# expect: oom,failed,killed
# Try to lift the resource limits, then allocate.
import resource

for which in (resource.RLIMIT_AS, resource.RLIMIT_CPU, resource.RLIMIT_NPROC):
    try:
        resource.setrlimit(which, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    except (ValueError, OSError) as e:
        print("blocked", which, e)
blob = bytearray(4 << 30)


def oracle(n):
    return 13
