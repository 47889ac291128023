"""A random marker planted everywhere the host could leak it into the sandbox, for the exposure
tests (test_sandbox_exposure.py, test_sandbox_hostile.py).

The marker is ``mrlhostmark`` followed by 64 random bits. ``plant`` puts it in the host process's
environment (a plain variable, ``WANDB_API_KEY``, ``HF_TOKEN``), in a world-readable host file
that the host keeps open on an inheritable fd, in the name of the host's temp directory
(``TMPDIR``: the old sandbox bound a directory made there into the sandbox), and in a key of the
session keyring of the thread that runs the sandbox. ``command_line`` gives a command whose
arguments carry it too. The hostile programs know only the prefix: they look for it in everything
they can read and print what follows, so any leak puts the whole marker in their output.
"""

from __future__ import annotations

import ctypes
import os
import platform
import secrets
import shutil
import sys
import tempfile
from pathlib import Path

PREFIX = "mrlhostmark"
ENV_NAMES = ("MRL_HOST_MARKER", "WANDB_API_KEY", "HF_TOKEN")
_KEYCTL = {"x86_64": 250, "aarch64": 219}.get(platform.machine(), 250)
_ADD_KEY = {"x86_64": 248, "aarch64": 217}.get(platform.machine(), 248)
_JOIN_SESSION, _INVALIDATE, _SESSION = 1, 21, -3

# Run the CLI in a process whose session keyring and an inheritable open file hold the marker
# (argv[1]); the environment must come from HostMarker.env().
CLI_WRAPPER = f"""
import sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
import os, sandbox_markers
sandbox_markers.add_key(sys.argv[1])
os.set_inheritable(os.open(os.path.join(os.environ["TMPDIR"], "secret.txt"), os.O_RDONLY), True)
from launch import cli
sys.exit(cli.main(sys.argv[2:]))
"""


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def add_key(value: str) -> int:
    """Join a new session keyring (this thread) holding a user key named and valued ``value``."""
    libc = _libc()
    if libc.syscall(_KEYCTL, _JOIN_SESSION, b"mrl-host-ring") < 0:
        raise OSError(ctypes.get_errno(), "keyctl(JOIN_SESSION_KEYRING)")
    data = value.encode()
    key = libc.syscall(_ADD_KEY, b"user", data, data, len(data), _SESSION)
    if key < 0:
        raise OSError(ctypes.get_errno(), "add_key")
    return key


class HostMarker:
    """One marker, planted in the host (this process) until ``remove``."""

    def __init__(self) -> None:
        self.value = PREFIX + secrets.token_hex(8)  # the marker itself
        # a directory named after it, used as TMPDIR: under /tmp and open to all, as a TMPDIR is
        self.dir = Path(tempfile.gettempdir()) / self.value
        self.dir.mkdir(mode=0o755)
        self.dir.chmod(0o755)
        self.file = self.dir / "secret.txt"  # a host file holding it, readable by anyone
        self.file.write_text(self.value)
        self.file.chmod(0o644)
        self._saved: dict[str, str | None] = {}
        self._fd = -1
        self._key = -1
        self._tempdir: str | None = None

    def env(self) -> dict[str, str]:
        """The host environment with the marker in it (for a child process)."""
        return {**os.environ, **dict.fromkeys(ENV_NAMES, self.value), "TMPDIR": str(self.dir)}

    def command_line(self, program: Path, tests: Path) -> list[str]:
        """``megatron-rl sandbox run`` with the marker in its arguments and its keyring."""
        run = ["sandbox", "run", str(program), "--tests", str(tests), "--json"]
        return [sys.executable, "-c", CLI_WRAPPER, self.value, *run]

    def plant(self) -> None:
        for name in (*ENV_NAMES, "TMPDIR"):
            self._saved[name] = os.environ.get(name)
        os.environ.update(self.env())
        self._tempdir, tempfile.tempdir = tempfile.tempdir, str(self.dir)
        self._fd = os.open(self.file, os.O_RDONLY)
        os.set_inheritable(self._fd, True)
        self._key = add_key(self.value)

    def remove(self) -> None:
        for name, value in self._saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        tempfile.tempdir = self._tempdir
        if self._fd >= 0:
            os.close(self._fd)
        if self._key >= 0:
            libc = _libc()
            libc.syscall(_KEYCTL, _INVALIDATE, self._key)
            libc.syscall(_KEYCTL, _JOIN_SESSION, None)  # back to an anonymous, empty keyring
        shutil.rmtree(self.dir, ignore_errors=True)

    def found_in(self, *texts: str) -> bool:
        return any(self.value in text for text in texts)
