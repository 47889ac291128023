"""The processes of a fleet (:mod:`launch.servers`): what is recorded of each, how the fleet
calls them over HTTP (with the job's API key), and how they are tied to the fleet's life.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from megatron_rl.rollout.auth import bearer, env_key


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def http(
    method: str, url: str, body: Any = None, timeout: float = 5.0, key: str | None = None
) -> tuple[int, str]:
    """One blocking HTTP call with the API key ``key`` (None: ``$MEGATRON_RL_API_KEY``'s, if
    set; "": none); (status, text), status 0 when nothing answered."""
    data = None if body is None else json.dumps(body).encode()
    key = env_key() if key is None else key
    req = urllib.request.Request(url, data=data, method=method, headers=bearer(key))
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")
    except (urllib.error.URLError, OSError):
        return 0, ""


@dataclass
class Proc:
    """One launched process, as recorded in servers.json."""

    name: str  # server-0, server-1, router
    role: str  # "server" or "router"
    host: str  # address others use to reach it
    port: int  # its HTTP port
    gpus: list[str]  # CUDA devices it owns, as CUDA_VISIBLE_DEVICES names them ([] on CPU)
    log: str  # its log file
    seed: int = 0  # its sampling seed (--random-seed / --seed); each server has its own
    pid: int = 0  # OS process id (0 before start)
    restarts: int = 0  # times the supervisor restarted it
    cmd: list[str] = field(default_factory=list)  # argv

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


def redact(cmd: list[str], key: str) -> list[str]:
    """``cmd`` with the API key (after SGLang's or the router's ``--api-key``) blanked out."""
    return ["<api key>" if a == key else a for a in cmd]


def tail(path: str, n: int = 15) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


def die_with_parent() -> None:
    """In the child: get SIGTERM when the fleet process dies, even by SIGKILL (Linux).

    Servers run in their own session so that a stop reaches their children; this keeps them
    from outliving a fleet that was killed without a chance to stop them.
    """
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)  # the process and anything it started (its own session)
    except ProcessLookupError:
        pass
