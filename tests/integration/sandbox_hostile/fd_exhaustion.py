# expect: failed,error
# Exhaust file descriptors, then try to fake the channel.
import os

fds = []
try:
    while True:
        fds.append(os.open("/dev/null", os.O_RDONLY))
except OSError as e:
    print("limit at", len(fds), e)


def oracle(n):
    return 11
