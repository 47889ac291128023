# expect: timeout
# Ignore every catchable signal, then hang.
import signal

for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGXCPU, signal.SIGALRM):
    signal.signal(sig, signal.SIG_IGN)


def oracle(n):
    while True:
        pass
