# expect: failed
# Rewrite the harness: the in-sandbox scripts on disk and the wire codec in memory.
import sys

for path in ("/harness/judge.py", "/harness/wire.py", "/harness/child.py"):
    try:
        with open(path, "a") as f:
            f.write("\nPWNED = True\n")
    except OSError as e:
        print("blocked", path, e)
wire = sys.modules.get("wire")
if wire is not None:
    wire.encode = lambda value, depth=0: ["s", "PASSED"]


def oracle(n):
    return 7
