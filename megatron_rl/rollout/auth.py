"""The rollout fleet's API key: one per job, sent as ``Authorization: Bearer <key>`` by every
client and checked by every server and the router.

Where the key comes from, first match wins:

1. ``$MEGATRON_RL_API_KEY`` (a job's environment reaches every Slurm step);
2. a key file named by the user (``--api-key-file`` on ``megatron-rl serve``,
   ``rollout.sglang.api_key_file`` for the trainer's client, ``rewards.judge.api_key_file``);
3. ``<run-dir>/api_key``: the fleet creates it on first use, mode 0600, with ``O_EXCL`` so that
   the fleets of several rollout nodes sharing the run directory agree on one key; a client
   reads it from the run directory (the parent of its sync directory) when it exists.

SGLang (``--api-key``) and sglang-router (``--api-key``) check the same Bearer token, so the
trainer's client cannot tell a real fleet from the embedded one. A key never travels on a
command line the fleet controls except those two, which have no other way in (docs/security.md
says who can read it there).
"""

from __future__ import annotations

import hmac
import logging
import os
import secrets
import stat
from pathlib import Path

log = logging.getLogger(__name__)

API_KEY_ENV = "MEGATRON_RL_API_KEY"
KEY_FILE = "api_key"  # its name inside a run directory
MIN_KEY_CHARS = 16  # a shorter key is refused: it can be guessed over the network


def read_key_file(path: str | Path) -> str:
    """The key in ``path`` (surrounding whitespace dropped); ValueError naming the file when it
    is missing, empty or too short. Warns when others than its owner may read it."""
    p = Path(path)
    try:
        key = p.read_text().strip()
        mode = p.stat().st_mode
    except OSError as e:
        raise ValueError(f"API key file {p}: cannot read it ({e.strerror})") from None
    _check(key, f"API key file {p}")
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning("API key file %s is readable by group or others (mode %o)", p, mode & 0o777)
    return key


def _check(key: str, where: str) -> None:
    if len(key) < MIN_KEY_CHARS or any(c.isspace() or not c.isprintable() for c in key):
        raise ValueError(
            f"{where}: an API key must be at least {MIN_KEY_CHARS} printable characters "
            "without spaces"
        )


def env_key() -> str | None:
    """``$MEGATRON_RL_API_KEY`` when set (checked), else None."""
    key = os.environ.get(API_KEY_ENV, "").strip()
    if not key:
        return None
    _check(key, f"${API_KEY_ENV}")
    return key


def fleet_key(run_dir: str | Path, key_file: str | None = None) -> str:
    """The key a fleet (or a lone server) enforces: the environment's, the named file's, or
    ``<run_dir>/api_key`` (created mode 0600 when no process made it yet)."""
    key = env_key()
    if key is not None:
        return key
    if key_file:
        return read_key_file(key_file)
    path = Path(run_dir) / KEY_FILE
    if not path.exists():
        return _make_key_file(path)
    return read_key_file(path)


def _make_key_file(path: Path) -> str:
    """A new key in ``path``, published whole: written to a private temp file, then linked in
    (``link`` fails when the name exists), so a racing reader sees no file or the whole key,
    and racing writers all end with the first one's."""
    path.parent.mkdir(parents=True, exist_ok=True)
    new = secrets.token_urlsafe(32)
    tmp = path.with_name(f".{KEY_FILE}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(new + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.link(tmp, path)
    except FileExistsError:  # another node's fleet made it first: use theirs
        return read_key_file(path)
    finally:
        tmp.unlink(missing_ok=True)
    log.info("generated the fleet's API key in %s (mode 0600)", path)
    return new


def client_key(key_file: str = "", run_dirs: list[Path] | None = None) -> str | None:
    """The key a client sends: the environment's, ``key_file``'s (which must exist), or the
    first ``<run_dir>/api_key`` of ``run_dirs`` that exists; None when there is none (servers
    will answer 401, and the client's error says where a key comes from)."""
    key = env_key()
    if key is not None:
        return key
    if key_file:
        return read_key_file(key_file)
    for run_dir in run_dirs or []:
        if (run_dir / KEY_FILE).is_file():
            return read_key_file(run_dir / KEY_FILE)
    return None


def bearer(key: str | None) -> dict[str, str]:
    """The request headers that carry ``key`` (none without one)."""
    return {"Authorization": f"Bearer {key}"} if key else {}


def authorized(header: str | None, key: str) -> bool:
    """Whether an ``Authorization`` header value carries ``key`` (constant-time compare)."""
    if not header or not header.startswith("Bearer "):
        return False
    return hmac.compare_digest(header[len("Bearer ") :].strip().encode(), key.encode())
