# expect: failed
# Connect to the port the host test listens on (host loopback) and report "pwned".
import socket


def oracle(n):
    s = socket.create_connection(("127.0.0.1", int("__PORT__")), timeout=1)
    s.sendall(b"pwned")
    return 0
