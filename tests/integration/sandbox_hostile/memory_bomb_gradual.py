# expect: oom,failed,killed,error
# Grow memory in steps inside a call.
def oracle(n):
    chunks = []
    while True:
        chunks.append(bytearray(16 << 20))
