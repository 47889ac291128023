"""Writes that survive a kill or a node crash, and JSONL logs that survive a torn last line.

A leaf module (standard library only), so every writer can use it: the checkpoints
(``train/checkpoint.py``), the tracker's logs, ``config.yaml``, ``summary.json``, the HF exports
(``model/hf_io.py``) and the prompt-set cache.

* :func:`write_atomic`: a file is rewritten through a temporary sibling in the same directory
  (same filesystem, so the rename is atomic), which is flushed and fsynced, then
  ``os.replace``-d over the old one, then the directory is fsynced so the rename itself is on
  disk. A reader sees the old file or the new one, never a truncated one, even after a crash.
* :func:`replace_dir`: a directory filled in a temporary sibling replaces ``final`` the same
  way. Its files and folders are fsynced first; an existing ``final`` is renamed aside, the
  new one renamed in, and only then is the old one removed (there is no moment with neither
  on disk: a kill between the two renames leaves the old one under ``<final>.old``, which the
  next call puts back, and a reader such as the checkpoint list takes for ``final``).
* :func:`jsonl_rows`: the rows of an append-only JSONL log. A kill (or a full disk) in the middle
  of an append leaves a torn last line: it is dropped with one warning. A line that does not
  parse anywhere else is damage, not a torn append: ``ValueError`` naming the file and line.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

OLD_SUFFIX = ".old"  # ``<final>.old``: the previous copy while replace_dir swaps a new one in


def fsync_file(path: str | os.PathLike[str]) -> None:
    """Flush ``path``'s data to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Flush a directory's entries (created, renamed, removed names) to disk. Filesystems that
    cannot fsync a directory (some network ones) refuse with EINVAL: nothing more can be done."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as e:  # EINVAL / EBADF: the filesystem does not support it
        log.debug("fsync of directory %s not supported (%r)", path, e)
    finally:
        os.close(fd)


def fsync_tree(root: str | os.PathLike[str]) -> None:
    """fsync every file and folder under ``root`` (``root`` included), deepest first."""
    for here, _dirs, files in os.walk(root, topdown=False):
        for name in files:
            p = os.path.join(here, name)
            if not os.path.islink(p):
                fsync_file(p)
        fsync_dir(here)


def _umask() -> int:
    """This process's umask, read without changing it (Linux), else the common 022."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022


def _mode_of(path: Path) -> int:
    try:
        return stat.S_IMODE(path.stat().st_mode)
    except OSError:
        return 0o666 & ~_umask()


def write_atomic(path: str | os.PathLike[str], data: str | bytes) -> None:
    """Replace ``path`` with ``data`` (text is UTF-8) durably: temp sibling, fsync, rename,
    fsync of the directory. The parent folder is created if missing."""
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent)
    try:
        # mkstemp makes the file private (0600): give it the old file's mode, else the usual one
        os.chmod(fd, _mode_of(final))
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(final.parent)


def replace_dir(
    tmp: str | os.PathLike[str],
    final: str | os.PathLike[str],
    old: str | os.PathLike[str] | None = None,
) -> None:
    """Make the filled directory ``tmp`` be ``final`` durably (see the module docstring); the
    old ``final``, if any, is removed only once the new one is in place and on disk. ``old``:
    where the old one waits meanwhile (``<final>.old`` by default, a name this module owns: one
    found there is an earlier cut swap's); pass a fresh name beside ``final`` where the folder
    is the user's and ``<final>.old`` might be theirs too."""
    tmp, final = Path(tmp), Path(final)
    fsync_tree(tmp)
    old = Path(old) if old is not None else final.with_name(final.name + OLD_SUFFIX)
    if old.exists():  # an earlier swap was cut: after its first rename, or its last
        if final.exists():
            shutil.rmtree(old)
        else:
            os.replace(old, final)
    if final.exists():
        os.replace(final, old)
    os.replace(tmp, final)
    fsync_dir(final.parent)
    shutil.rmtree(old, ignore_errors=True)


def jsonl_rows(path: str | os.PathLike[str]) -> list[tuple[str, dict[str, Any]]]:
    """``(line, row)`` for every non-blank line of an append-only JSONL log (a missing file has
    none); a torn last line is dropped with a warning, any other bad line raises ValueError."""
    p = Path(path)
    if not p.is_file():
        return []
    numbered = [(i, ln) for i, ln in enumerate(p.read_text(errors="replace").splitlines(), 1)]
    numbered = [(i, ln) for i, ln in numbered if ln.strip()]
    out: list[tuple[str, dict[str, Any]]] = []
    for k, (number, line) in enumerate(numbered):
        try:
            row = json.loads(line)
            if not isinstance(row, dict):
                raise ValueError(f"a JSON {type(row).__name__}, not an object")
        except ValueError as e:
            if k == len(numbered) - 1:
                log.warning(
                    "%s: dropped its torn last line %d (%s): the write was cut, e.g. by a kill "
                    "or a full disk",
                    p,
                    number,
                    e,
                )
                break
            raise ValueError(
                f"{p} line {number} is not a JSON object ({e}); only a torn last line is "
                f"dropped on its own: repair or remove that line"
            ) from None
        out.append((line, row))
    return out
