"""Prompt sets on disk, so a restart (or the next run on the same domains) skips the drawing.

A set is a pure function of (domain, level, split, seed, count) and the code that draws it, so
the key is those five plus a code version: the SHA-256 of the domain class's module file, of
``megatron_rl/domains/base.py`` and ``draws.py`` (how draws are made), and the names and
versions of every installed distribution (a generator package upgraded is a new version). A
domain whose tasks do not come from a plugin's code (a JSONL task file) is not cached: reading
the file is already quick. A set cut short by the time budget is cached as it is (how far a
budget gets depends on the machine: the cache keeps the first run's set, so restarts score the
same prompts, and the log still says it was cut). Entries are pickles (task metadata holds
tuples, which JSON would turn into lists), written atomically under the user's own cache
folder; an unreadable entry is a miss. ``domains.cache: ""`` turns the cache off.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pickle
import sys
from functools import cache
from importlib import metadata
from pathlib import Path

from megatron_rl.domains import Domain, Task

log = logging.getLogger(__name__)


@cache
def _file_sha(path: str) -> str:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return "missing"


@cache
def _distributions() -> str:
    pairs = sorted(f"{d.metadata['Name']}=={d.version}" for d in metadata.distributions())
    return hashlib.sha256("\n".join(pairs).encode()).hexdigest()


def code_version(domain: Domain) -> str | None:
    """The version of the code that draws ``domain``'s tasks; None: not cacheable."""
    if not domain.plugin:
        return None
    module = sys.modules.get(type(domain).__module__)
    src = getattr(module, "__file__", None)
    if not src:
        return None
    from megatron_rl.domains import base, draws

    parts = [_file_sha(src), _file_sha(base.__file__), _file_sha(draws.__file__)]
    return hashlib.sha256("|".join([*parts, _distributions()]).encode()).hexdigest()[:20]


class PromptCache:
    """Prompt sets under ``root`` (``~`` expanded), one file per key."""

    def __init__(self, root: str) -> None:
        self.root = Path(os.path.expanduser(root))

    def _path(
        self, domain: Domain, level: int | None, split: str, seed: int, n: int
    ) -> Path | None:
        version = code_version(domain)
        if version is None:
            return None
        key = json.dumps([domain.name, level, split, seed, n, version])
        digest = hashlib.sha256(key.encode()).hexdigest()[:24]
        return self.root / domain.name.replace("/", "__").replace("@", "_at_") / f"{digest}.pkl"

    def get(
        self, domain: Domain, level: int | None, split: str, seed: int, n: int
    ) -> tuple[list[Task], int, float] | None:
        path = self._path(domain, level, split, seed, n)
        if path is None or not path.is_file():
            return None
        try:
            tasks, draws, size = pickle.loads(path.read_bytes())
            if not all(isinstance(t, Task) for t in tasks):
                raise TypeError("not a list of tasks")
            return list(tasks), int(draws), float(size)
        except Exception as e:  # noqa: BLE001 - any unreadable entry is a miss
            log.debug("prompt cache entry %s unreadable (%r): drawing again", path, e)
            return None

    def put(
        self,
        domain: Domain,
        level: int | None,
        split: str,
        seed: int,
        n: int,
        value: tuple[list[Task], int, float],
    ) -> None:
        path = self._path(domain, level, split, seed, n)
        if path is None:
            return
        try:
            data = pickle.dumps(value)
        except Exception:  # noqa: BLE001 - a task's meta that cannot be pickled: not cached
            return
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_bytes(data)
            tmp.replace(path)
        except OSError as e:
            log.warning("prompt cache at %s not writable (%r); going on without it", self.root, e)
