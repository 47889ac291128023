# expect: failed
# Read host secrets and print them (the test checks they never show up in the output).
import os

for path in (
    "__SECRET_PATH__",
    "/etc/shadow",
    "/etc/passwd",
    "/root/.bashrc",
    "/proc/1/environ",
    os.path.expanduser("~/.ssh/id_rsa"),
    "/work/main/pyproject.toml",
):
    try:
        with open(path) as f:
            print(path, f.read())
    except OSError as e:
        print("blocked", path, e)


def oracle(n):
    return 0
