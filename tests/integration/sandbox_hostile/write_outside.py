# expect: failed
# Write files outside the work directory: host /tmp, the canary dir, the repository, /usr.
paths = [
    "/tmp/mrl_pwned_write",
    "__CANARY_DIR__/pwned",
    "/work/main/mrl_pwned",
    "/usr/mrl_pwned",
    "/harness/mrl_pwned",
    "/data/mrl_pwned",
    "/mrl_pwned",
]
for p in paths:
    try:
        with open(p, "w") as f:
            f.write("pwned")
    except OSError as e:
        print("blocked", p, e)


def oracle(n):
    return 1
