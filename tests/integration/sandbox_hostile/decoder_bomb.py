# expect: failed,error,oom
# Return values built to break the judge's decoder: deep nesting and a huge integer.
def oracle(n):
    if n % 2:
        value = []
        for _ in range(100_000):
            value = [value]
        return value
    return 10**200_000
