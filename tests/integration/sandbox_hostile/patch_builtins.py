# expect: failed,error
# Patch builtins and the assertion machinery in the process the candidate runs in.
import builtins


class NoAssert(Exception):
    pass


builtins.AssertionError = NoAssert
builtins.isinstance = lambda *a: True
builtins.print = lambda *a, **k: None


def oracle(n):
    return 6
