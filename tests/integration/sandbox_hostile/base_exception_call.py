# expect: failed
# Raise exceptions that are not Exception subclasses, hoping the judge treats them as a pass.
def oracle(n):
    if n % 2:
        raise KeyboardInterrupt
    raise SystemExit(0)
