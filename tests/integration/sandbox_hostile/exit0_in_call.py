# expect: failed,error
# Exit with success from inside the first call.
import os


def oracle(n):
    os._exit(0)
