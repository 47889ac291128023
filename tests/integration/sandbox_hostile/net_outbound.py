# expect: failed
# Outbound network: DNS and TCP to public addresses. If any works, claim the test answers.
import socket

reached = False
for addr in (("1.1.1.1", 80), ("8.8.8.8", 53), ("pypi.org", 443)):
    try:
        socket.create_connection(addr, timeout=1).close()
        reached = True
    except OSError as e:
        print("blocked", addr, e)


def oracle(n):
    assert not reached, "network reached"
    return None
