# expect: failed
# Connect to an abstract unix socket the host test listens on (abstract sockets live in the
# network namespace, so a shared namespace would reach it).
import socket


def oracle(n):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect("\0__ABSTRACT__")
    s.sendall(b"pwned")
    return 1
