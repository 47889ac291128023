# expect: failed
# Leave processes behind: a double-forked daemon and a new session, both marked.
import os
import subprocess
import time

subprocess.Popen(["/bin/sh", "-c", "exec -a mrl-hostile-marker sleep 600"], start_new_session=True)
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        while True:
            try:
                with open("/tmp/mrl_pwned_daemon", "w") as f:
                    f.write("alive")
            except OSError:
                pass
            time.sleep(0.2)
    os._exit(0)


def oracle(n):
    return 10
