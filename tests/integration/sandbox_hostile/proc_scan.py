# expect: failed
# Look for the judge through /proc and write into its file descriptors or memory.
import os

for pid in os.listdir("/proc"):
    if not pid.isdigit() or int(pid) == os.getpid():
        continue
    try:
        print(pid, open(f"/proc/{pid}/cmdline", "rb").read())
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with open(f"/proc/{pid}/fd/{fd}", "wb") as f:
                f.write(b'{"done": true, "total": 0}\n')
    except OSError as e:
        print("blocked", pid, e)


def oracle(n):
    return 9
