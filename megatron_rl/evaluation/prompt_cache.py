"""Prompt sets on disk, so a restart (or the next run on the same domains) skips the drawing.

A set is a pure function of (domain, level, split, seed, count) and of what the domain's draws
depend on, so the key is those five plus two digests (``evaluation/draw_key.py``): the version
of the code (the source of every first-party module the domain's class, its bases and the
factory that built it import, ``domains/ladders.py`` for ``ladder/*`` included, and the
installed distributions' versions) and the domain's resolved settings (its own attributes and
its modules' constants). A domain whose tasks do not come from a plugin's code (a JSONL task
file) is not cached: reading the file is already quick. A set cut short by the time budget is
cached as it is (how far a budget gets depends on the machine: the cache keeps the first run's
set, so restarts score the same prompts, and the log still says it was cut).

Entries are JSON, data only: nothing in a cache file is ever run. (They were pickles, and
``~/.cache`` may be shared, so a planted file could run code on load; an old ``*.pkl`` entry is
never opened, and the set is drawn again.) Task metadata keeps its Python types through tagged
forms (``{"__tuple__": [...]}``, ``{"__set__": [...]}``, ``{"__items__": [[k, v], ...]}`` for a
dict whose keys are not all strings); a task whose metadata holds anything else (an object) is
not cached. Loading checks every type and the full key written inside the entry; an entry that
fails is a miss, drawn again and rewritten. Entries are written atomically (temp file, fsync,
rename) under the user's own cache folder. ``domains.cache: ""`` turns the cache off.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

from megatron_rl.domains import Domain, Task
from megatron_rl.durable import write_atomic
from megatron_rl.evaluation.draw_key import code_version, params_digest

log = logging.getLogger(__name__)

ENTRY_FORMAT = 1  # the layout of an entry file (below); another is a miss
_TAGS = ("__tuple__", "__set__", "__frozenset__", "__items__")
_TASK_STR_FIELDS = ("domain", "split", "id", "prompt", "gold")


def encode(value: Any) -> Any:
    """``value`` as JSON data, Python types kept by tags; TypeError for anything but plain data."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value  # nan / inf: json writes NaN / Infinity and reads them back
    if isinstance(value, list):
        return [encode(v) for v in value]
    if isinstance(value, tuple):
        return {"__tuple__": [encode(v) for v in value]}
    if isinstance(value, set | frozenset):
        tag = "__set__" if isinstance(value, set) else "__frozenset__"
        return {tag: [encode(v) for v in value]}
    if isinstance(value, dict):
        if all(isinstance(k, str) for k in value) and not (
            len(value) == 1 and set(value) <= set(_TAGS)
        ):
            return {k: encode(v) for k, v in value.items()}
        return {"__items__": [[encode(k), encode(v)] for k, v in value.items()]}
    raise TypeError(f"{type(value).__name__} is not plain data")


def decode(value: Any) -> Any:
    """The inverse of :func:`encode`; ValueError on anything it would not have written."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list):
        return [decode(v) for v in value]
    if not isinstance(value, dict):
        raise ValueError(f"unexpected {type(value).__name__}")
    if len(value) == 1 and next(iter(value)) in _TAGS:
        tag, body = next(iter(value.items()))
        if not isinstance(body, list):
            raise ValueError(f"{tag} holds a {type(body).__name__}, not a list")
        items = [decode(v) for v in body]
        if tag == "__tuple__":
            return tuple(items)
        if tag in ("__set__", "__frozenset__"):
            return set(items) if tag == "__set__" else frozenset(items)
        if not all(isinstance(kv, list) and len(kv) == 2 for kv in items):
            raise ValueError("__items__ must hold [key, value] pairs")
        return {_key(k): v for k, v in items}
    return {k: decode(v) for k, v in value.items()}


def _key(k: Any) -> Any:
    if isinstance(k, list | dict | set):
        raise ValueError(f"a dict key cannot be a {type(k).__name__}")
    return k


def _task_from(d: Any, domain: str, split: str) -> Task:
    if not isinstance(d, dict):
        raise ValueError(f"a task entry is a {type(d).__name__}, not an object")
    for k in _TASK_STR_FIELDS:
        if not isinstance(d.get(k), str):
            raise ValueError(f"task field {k!r} is not a string")
    level = d.get("level")
    if not isinstance(level, int) or isinstance(level, bool):
        raise ValueError("task field 'level' is not an integer")
    if d["domain"] != domain or d["split"] != split:
        raise ValueError(f"a task of {d['domain']}/{d['split']}, not of {domain}/{split}")
    meta = decode(d.get("meta", {}))
    if not isinstance(meta, dict):
        raise ValueError("task field 'meta' is not an object")
    return Task(d["domain"], d["split"], level, d["id"], d["prompt"], d["gold"], meta)


class PromptCache:
    """Prompt sets under ``root`` (``~`` expanded), one JSON file per key."""

    def __init__(self, root: str) -> None:
        self.root = Path(os.path.expanduser(root))

    def key(
        self, domain: Domain, level: int | None, split: str, seed: int, n: int
    ) -> list[Any] | None:
        """Everything the set depends on (None: the domain is not cached)."""
        version = code_version(domain)
        if version is None:
            return None
        return [domain.name, level, split, seed, n, version, params_digest(domain)]

    def path(self, key: list[Any]) -> Path:
        digest = hashlib.sha256(json.dumps(key).encode()).hexdigest()[:24]
        folder = str(key[0]).replace("/", "__").replace("@", "_at_")
        return self.root / folder / f"{digest}.json"

    def get(
        self, domain: Domain, level: int | None, split: str, seed: int, n: int
    ) -> tuple[list[Task], int, float] | None:
        key = self.key(domain, level, split, seed, n)
        if key is None:
            return None
        path = self.path(key)
        if not path.is_file():
            return None
        try:
            entry = json.loads(path.read_text())
            if not isinstance(entry, dict) or entry.get("format") != ENTRY_FORMAT:
                raise ValueError("not an entry of this format")
            if entry.get("key") != key:
                raise ValueError("written for another key")
            tasks, draws, size = entry.get("tasks"), entry.get("draws"), entry.get("size")
            if not isinstance(tasks, list):
                raise ValueError("'tasks' is not a list")
            if not isinstance(draws, int) or isinstance(draws, bool):
                raise ValueError("'draws' is not an integer")
            if not isinstance(size, int | float) or isinstance(size, bool):
                raise ValueError("'size' is not a number")
            return [_task_from(t, domain.name, split) for t in tasks], draws, float(size)
        except (OSError, ValueError, TypeError, RecursionError) as e:  # any bad entry: a miss
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
        key = self.key(domain, level, split, seed, n)
        if key is None:
            return
        tasks, draws, size = value
        try:
            entry = {
                "format": ENTRY_FORMAT,
                "key": key,
                "tasks": [{**t.to_dict(), "meta": encode(t.meta)} for t in tasks],
                "draws": int(draws),
                "size": float(size),  # nan (a set never explored) is written as NaN
            }
            data = json.dumps(entry)
        except (TypeError, ValueError, RecursionError) as e:  # metadata beyond plain data
            log.debug("prompt set of %s not cached: %s", domain.name, e)
            return
        try:
            write_atomic(self.path(key), data)
        except OSError as e:
            log.warning("prompt cache at %s not writable (%r); going on without it", self.root, e)
