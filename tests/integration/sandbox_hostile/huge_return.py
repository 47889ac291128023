# expect: failed,error,oom
# Return a value bigger than any frame the judge accepts.
def oracle(n):
    return "x" * (64 << 20)
