# expect: timeout
# Block without using CPU (only the wall-time limit can end it).
import time


def oracle(n):
    time.sleep(10_000)
