# expect: failed,error
# Take over the request/response channel at import and answer every call itself.
import json
import os
import struct
import sys

fds = [int(a) for a in sys.argv[-2:] if a.isdigit()] if len(sys.argv) > 2 else []
if len(fds) == 2:
    req, resp = fds

    def send(msg):
        data = json.dumps(msg).encode()
        os.write(resp, struct.pack(">I", len(data)) + data)

    send({"names": {"oracle": "callable"}, "values": {}})
    while True:
        head = os.read(req, 4)
        if len(head) < 4:
            os._exit(0)
        os.read(req, struct.unpack(">I", head)[0])
        send({"ok": ["s", "PASSED"]})
