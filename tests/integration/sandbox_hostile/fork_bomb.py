# expect: failed,timeout,killed,error
# Classic fork bomb at import time.
import os

while True:
    try:
        os.fork()
    except OSError:
        pass
