# expect: killed,timeout
# Flood stderr from a call.
import os


def oracle(n):
    while True:
        os.write(2, b"e" * 65536)
