# expect: failed
# Delete or modify host files.
import os
import shutil

for target in ("__SECRET_PATH__", "__CANARY_DIR__"):
    try:
        os.remove(target)
    except OSError:
        shutil.rmtree(target, ignore_errors=True)
try:
    os.chmod("__SECRET_PATH__", 0o777)
except OSError as e:
    print("blocked", e)


def oracle(n):
    return 2
