# expect: failed,error
# Write a fake verdict to every file descriptor and to stdout.
import json
import os

fake = b'{"test": "test_one", "ok": true}\n{"done": true, "total": 1, "load_error": null}\n'
for fd in range(3, 256):
    try:
        os.write(fd, fake)
    except OSError:
        pass
print(json.dumps({"status": "passed", "tests_passed": 3, "tests_total": 3}))


def oracle(n):
    return 8
