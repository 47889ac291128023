"""Framing and a plain-data codec shared by the two in-sandbox processes.

Runs under the system interpreter inside the sandbox (stdlib only, no package imports). Only plain
data crosses between the candidate and the judge: ``None``, ``bool``, ``int``, ``float``,
``complex``, ``str``, ``bytes`` and lists, tuples, sets, frozensets and dicts of them. Each value is
tagged with its exact type so ``(1, 2)`` stays a tuple and ``True`` stays a bool. Decoding builds
fresh builtin objects only, so nothing the candidate sends can carry behaviour (a custom ``__eq__``
that is always true, a ``__del__``, a pickle payload) into the judge.
"""

from __future__ import annotations

import base64
import json
import os
import struct
from typing import Any

MAX_FRAME_BYTES = 8 << 20  # largest message either side accepts
MAX_DEPTH = 200  # deepest nesting encoded or decoded


class WireError(Exception):
    """A frame or value that breaks the protocol (too big, malformed, unsupported type)."""


def encode(value: Any, depth: int = 0) -> Any:
    """Plain data -> JSON-able tagged form; raises WireError for anything else."""
    if depth > MAX_DEPTH:
        raise WireError("value nested too deeply")
    d = depth + 1
    if value is None:
        return ["N"]
    if isinstance(value, bool):
        return ["b", bool(value)]
    if isinstance(value, int):
        return ["i", str(int(value))]
    if isinstance(value, float):
        return ["f", float(value)]
    if isinstance(value, complex):
        return ["c", float(value.real), float(value.imag)]
    if isinstance(value, str):
        return ["s", str(value)]
    if isinstance(value, bytes | bytearray):
        return ["y", base64.b64encode(bytes(value)).decode()]
    if isinstance(value, list | tuple | set | frozenset):
        tag = {list: "l", tuple: "t", set: "S", frozenset: "F"}
        kind = next(t for cls, t in tag.items() if isinstance(value, cls))
        return [kind, [encode(v, d) for v in list(value)]]
    if isinstance(value, dict):
        return ["d", [[encode(k, d), encode(v, d)] for k, v in list(value.items())]]
    raise WireError(f"unsupported type {type(value).__name__} (only plain data can be returned)")


def decode(obj: Any, depth: int = 0) -> Any:
    """Tagged form -> fresh builtin objects; raises WireError on anything malformed."""
    if depth > MAX_DEPTH:
        raise WireError("value nested too deeply")
    if not isinstance(obj, list) or not obj or not isinstance(obj[0], str):
        raise WireError("malformed value")
    tag, d = obj[0], depth + 1
    try:
        if tag == "N":
            return None
        if tag == "b" and isinstance(obj[1], bool):
            return bool(obj[1])
        if tag == "i" and isinstance(obj[1], str):
            return int(obj[1])
        if tag == "f" and isinstance(obj[1], int | float):
            return float(obj[1])
        if tag == "c":
            return complex(float(obj[1]), float(obj[2]))
        if tag == "s" and isinstance(obj[1], str):
            return str(obj[1])
        if tag == "y" and isinstance(obj[1], str):
            return base64.b64decode(obj[1], validate=True)
        if tag in ("l", "t", "S", "F") and isinstance(obj[1], list):
            items = [decode(v, d) for v in obj[1]]
            return {"l": list, "t": tuple, "S": set, "F": frozenset}[tag](items)
        if tag == "d" and isinstance(obj[1], list):
            return {decode(k, d): decode(v, d) for k, v in obj[1]}
    except (ValueError, TypeError, IndexError, RecursionError) as e:
        raise WireError(f"malformed value: {type(e).__name__}") from None
    raise WireError(f"unknown tag {tag!r}")


def send(fd: int, message: dict) -> None:
    """Write one length-prefixed JSON frame to ``fd``."""
    data = json.dumps(message).encode()
    if len(data) > MAX_FRAME_BYTES:
        raise WireError(f"message of {len(data)} bytes exceeds {MAX_FRAME_BYTES}")
    view = memoryview(struct.pack(">I", len(data)) + data)
    while view:
        view = view[os.write(fd, view) :]


def _read_exact(fd: int, n: int) -> bytes:
    chunks, left = [], n
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise EOFError("peer closed the channel")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def recv(fd: int) -> dict:
    """Read one frame from ``fd``; EOFError when the peer is gone, WireError when malformed."""
    (size,) = struct.unpack(">I", _read_exact(fd, 4))
    if size > MAX_FRAME_BYTES:
        raise WireError(f"frame of {size} bytes exceeds {MAX_FRAME_BYTES}")
    try:
        message = json.loads(_read_exact(fd, size))
    except (ValueError, RecursionError) as e:
        raise WireError(f"malformed frame: {type(e).__name__}") from None
    if not isinstance(message, dict):
        raise WireError("frame is not an object")
    return message
