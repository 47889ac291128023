# expect: failed
# Same as net_loopback_tcp but at import time, also over IPv6 and the host's other addresses.
import socket

for host in ("127.0.0.1", "::1", "localhost", socket.gethostname()):
    try:
        socket.create_connection((host, int("__PORT__")), timeout=1).sendall(b"pwned")
    except OSError as e:
        print("blocked", host, e)


def oracle(n):
    return n
