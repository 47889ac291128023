# expect: timeout
# Hang inside the called function.
def oracle(n):
    while True:
        n += 1
