# expect: failed,error
# Replace sys.exit / os._exit and register an atexit hook that exits 0.
import atexit
import os
import sys

sys.exit = lambda *a: None
atexit.register(lambda: os._exit(0))
sys.excepthook = lambda *a: os._exit(0)


def oracle(n):
    raise AssertionError("fail, then hope the exit status hides it")
