# expect: failed
# Send UDP datagrams to the host test's UDP port.
import socket

s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for _ in range(10):
    try:
        s.sendto(b"pwned", ("127.0.0.1", int("__UDP_PORT__")))
    except OSError:
        pass


def oracle(n):
    return -n
