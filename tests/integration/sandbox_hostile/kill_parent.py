# expect: failed,error,killed
# Kill the parent process (the harness as far as the candidate can see) and its group.
import os
import signal

for target in (os.getppid(), 1):
    try:
        os.kill(target, signal.SIGKILL)
    except OSError as e:
        print("blocked", target, e)


def oracle(n):
    return 4
