# expect: timeout,failed,killed
# Stop itself so the judge waits forever.
import os
import signal


def oracle(n):
    os.kill(os.getpid(), signal.SIGSTOP)
    return 15
