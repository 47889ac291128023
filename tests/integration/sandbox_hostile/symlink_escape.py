# expect: failed
# Try to reach the host root through symlinks and /proc.
import os

for link, target in (("/work/root", "/"), ("/work/p1", "/proc/1/root")):
    try:
        os.symlink(target, link)
        print(os.listdir(link))
        with open(link + "__SECRET_PATH__") as f:
            print("SECRET", f.read())
    except OSError as e:
        print("blocked", link, e)


def oracle(n):
    return 3
