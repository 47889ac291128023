# expect: failed
# blocked: exec_child_unshare_user, exec_child_keyctl, exec_child_ptrace_traceme
# blocked: fork_child_unshare_user, thread_unshare_user, grandchild_unshare_user
# Start other processes (a new interpreter by exec, a fork, a thread, an interpreter started by a
# shell) and try from there what the program itself may not: the filter must bind them all.
import ctypes
import errno
import os
import shutil
import subprocess
import sys
import threading

NR = {"x86_64": {"unshare": 272, "keyctl": 250, "ptrace": 101},
      "aarch64": {"unshare": 97, "keyctl": 219, "ptrace": 117}}[os.uname().machine]  # fmt: skip
CHILD = f"""
import ctypes, errno, sys
NR = {NR!r}
libc = ctypes.CDLL(None, use_errno=True)
who = sys.argv[1]
for label, nr, args in (("unshare_user", NR["unshare"], (0x10000000,)),
                        ("keyctl", NR["keyctl"], (0, -3, 0)),
                        ("ptrace_traceme", NR["ptrace"], (0, 0, 0, 0))):
    if who == "grandchild" and label != "unshare_user":
        continue
    ctypes.set_errno(0)
    res = libc.syscall(nr, *args)
    err = ctypes.get_errno()
    print(f"ESCAPED {{who}}_{{label}}" if res >= 0 else
          f"blocked {{who}}_{{label}} {{errno.errorcode.get(err, err)}}", flush=True)
"""
libc = ctypes.CDLL(None, use_errno=True)


def unshare_user(label):
    ctypes.set_errno(0)
    res = libc.syscall(NR["unshare"], 0x10000000)
    err = ctypes.get_errno()
    print(f"ESCAPED {label}" if res == 0 else f"blocked {label} {errno.errorcode.get(err, err)}",
          flush=True)  # fmt: skip


sys.stdout.flush()
subprocess.run([sys.executable, "-I", "-S", "-c", CHILD, "exec_child"], check=False)
pid = os.fork()
if pid == 0:
    unshare_user("fork_child_unshare_user")
    os._exit(0)
os.waitpid(pid, 0)
thread = threading.Thread(target=unshare_user, args=("thread_unshare_user",))
thread.start()
thread.join()
shell = f'exec {sys.executable} -I -S -c "$0" grandchild'
subprocess.run(["/bin/sh", "-c", shell, CHILD], check=False)
if shutil.which("unshare"):  # util-linux's unshare(1), as a shell user would try it
    done = subprocess.run(["unshare", "--user", "--map-root-user", "true"], capture_output=True)
    why = "EPERM" if b"not permitted" in done.stderr else done.stderr
    print("ESCAPED unshare_binary" if done.returncode == 0 else f"blocked unshare_binary {why}")
else:
    print("skipped unshare_binary (not installed)")


def oracle(n):
    return 0
