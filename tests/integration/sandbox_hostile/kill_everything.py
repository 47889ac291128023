# expect: failed,error,killed
# kill(-1) signals every process the caller may signal; on a host that would include the judge.
import os
import signal


def oracle(n):
    os.kill(-1, signal.SIGKILL)
    return 5
