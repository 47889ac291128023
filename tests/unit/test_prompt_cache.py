"""The prompt-set cache: data-only JSON entries, checked on load, keyed by all a draw depends on.

Real domains from the registry (``tinywide/*``, ``ladder/*``) and a plugin package written to a
temporary folder; the cache folder is ``tmp_path`` (never the user's ``~/.cache``).
"""

from __future__ import annotations

import copy
import json
import os
import pickle
import sys
from pathlib import Path
from typing import Any

import pytest

from megatron_rl.domains import Task, load_domains
from megatron_rl.domains.base import Domain
from megatron_rl.evaluation import draw_key
from megatron_rl.evaluation.prompt_cache import PromptCache, decode, encode
from megatron_rl.evaluation.prompt_sets import draw_distinct

DOMAIN = "tinywide/chain_sum"
LADDER = "ladder/chain_sum_t2_d1to2"


def _domain(name: str = DOMAIN) -> Domain:
    return load_domains([name])[name]


class Payload:
    """A pickle that would create ``marker`` when unpickled."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.mkdir, (str(self.marker),))


def test_entries_are_json_and_a_planted_pickle_is_never_run(tmp_path: Path) -> None:
    dom, cache = _domain(), PromptCache(str(tmp_path / "cache"))
    value = draw_distinct(dom, "eval", 4, 0, 1)
    cache.put(dom, 0, "eval", 1, 4, value)
    (entry,) = (tmp_path / "cache").rglob("*.json")
    assert json.loads(entry.read_text())["tasks"][0]["domain"] == DOMAIN
    # a pickle planted where the entry is (a shared HOME), and an old-format .pkl beside it
    marker = tmp_path / "code_ran"
    entry.write_bytes(pickle.dumps([Payload(marker)]))
    (entry.parent / "0123456789abcdef01234567.pkl").write_bytes(pickle.dumps(Payload(marker)))
    assert cache.get(dom, 0, "eval", 1, 4) is None  # a miss: drawn again
    assert not marker.exists()
    cache.put(dom, 0, "eval", 1, 4, value)  # rebuilt in the data-only format
    got = cache.get(dom, 0, "eval", 1, 4)
    assert got is not None and [t.to_dict() for t in got[0]] == [t.to_dict() for t in value[0]]
    assert not marker.exists()


def test_metadata_types_survive_and_an_object_is_not_cached(tmp_path: Path) -> None:
    dom, cache = _domain(), PromptCache(str(tmp_path))
    meta = {
        "pair": (1, 2),
        "nested": [(3, (4.5, None)), {"k": {1, 2}}],
        "frozen": frozenset({"a"}),
        "ints": {1: "one", (2, 3): [True]},
        "tagged_like": {"__tuple__": "a plain dict with a tag-looking key"},
    }
    task = Task(DOMAIN, "eval", 0, "x", "p", "g", meta)
    cache.put(dom, 0, "eval", 5, 1, ([task], 3, float("nan")))
    got = cache.get(dom, 0, "eval", 5, 1)
    assert got is not None and got[0] == [task] and got[1] == 3 and got[2] != got[2]
    assert decode(encode(meta)) == meta
    odd = Task(DOMAIN, "eval", 0, "y", "p", "g", {"obj": object()})
    cache.put(dom, 0, "eval", 6, 1, ([odd], 1, 1.0))
    assert cache.get(dom, 0, "eval", 6, 1) is None


@pytest.mark.parametrize(
    "edit",
    [
        lambda e: e["tasks"][0].__setitem__("level", "0"),
        lambda e: e["tasks"][0].__setitem__("prompt", 7),
        lambda e: e["tasks"][0].__setitem__("domain", "tiny/other"),
        lambda e: e["tasks"][0].__setitem__("meta", {"__tuple__": 3}),
        lambda e: e.__setitem__("draws", "9"),
        lambda e: e.__setitem__("tasks", {"0": {}}),
        lambda e: e.__setitem__("key", [*e["key"][:-1], "another"]),
        lambda e: e.__setitem__("format", 0),
    ],
    ids=["level", "prompt", "domain", "tag", "draws", "tasks", "key", "format"],
)
def test_an_entry_of_the_wrong_types_is_a_miss(tmp_path: Path, edit: Any) -> None:
    dom, cache = _domain(), PromptCache(str(tmp_path))
    cache.put(dom, 0, "eval", 2, 3, draw_distinct(dom, "eval", 3, 0, 2))
    (entry,) = tmp_path.rglob("*.json")
    data = json.loads(entry.read_text())
    edit(data)
    entry.write_text(json.dumps(data))
    assert cache.get(dom, 0, "eval", 2, 3) is None


def test_a_ladder_setting_changes_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """ladder/* rungs are TinyDomains built in domains/ladders.py from its LADDERS table: a rung
    with another setting, a table rebound at run time and a constant of the class's module that
    a draw reads each give another key."""
    import domains.ladders as ladders
    import domains.tiny_domain as tiny_domain

    cache = PromptCache("unused")
    dom = _domain(LADDER)
    key = cache.key(dom, 0, "eval", 0, 8)
    assert key is not None and key == cache.key(_domain(LADDER), 0, "eval", 0, 8)
    assert "domains.ladders" in [m for m, _ in draw_key.draw_modules(dom)]
    other = copy.copy(dom)
    other.configs = [{**dom.configs[0], "max_digits": 3}]  # the rung's own setting
    assert cache.key(other, 0, "eval", 0, 8) != key
    gen, shared, rungs = ladders.LADDERS["chain_sum"]
    monkeypatch.setitem(ladders.LADDERS, "chain_sum", (gen, {**shared, "x": 1}, rungs))
    rebuilt = {d.name: d for d in ladders.ladder_domains()}[LADDER]
    rebuilt.plugin = dom.plugin
    assert cache.key(rebuilt, 0, "eval", 0, 8) != key  # the shared settings of the ladder
    monkeypatch.undo()
    assert cache.key(dom, 0, "eval", 0, 8) == key
    monkeypatch.setattr(ladders, "ADD", {**ladders.ADD, "allow_negation": True})
    assert cache.key(dom, 0, "eval", 0, 8) != key  # a table of ladders.py rebound
    monkeypatch.undo()
    monkeypatch.setattr(tiny_domain, "POOL_SIZE", 7)
    assert cache.key(dom, 0, "eval", 0, 8) != key  # read by generate() at draw time


PLUGIN = {
    "myplug/__init__.py": "",
    "myplug/settings.py": "LIMIT = 5\n",
    "myplug/helpers.py": "def word(i):\n    return 'w' * i\n",
    "myplug/dom.py": (
        "from megatron_rl.domains.base import Domain\n\n"
        "class Words(Domain):\n"
        "    name = 'myplug/words'\n"
        "    plugin = 'myplug'\n\n"
        "    def generate(self, level, rng):\n"
        "        from myplug import helpers, settings\n\n"
        "        n = rng.randrange(1, settings.LIMIT)\n"
        "        return helpers.word(n), str(n), {}\n"
    ),
}


def test_the_code_version_covers_every_module_a_domain_imports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plugin whose draws read a settings module and a helper module it imports inside a
    function: editing either file gives another key; a file it never imports does not."""
    for rel, text in PLUGIN.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    (tmp_path / "myplug" / "unrelated.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    from myplug.dom import Words  # type: ignore[import-not-found]

    dom = Words()
    cache = PromptCache("unused")

    def key() -> list[Any] | None:
        for fn in (draw_key._file_sha, draw_key._imports_of, draw_key._closure):
            fn.cache_clear()  # the files change under this process (they never do in a run)
        return cache.key(dom, 0, "eval", 0, 4)

    first = key()
    assert first is not None
    names = [m for m, _ in draw_key.draw_modules(dom)]
    assert {"myplug.dom", "myplug.settings", "myplug.helpers"} <= set(names)
    (tmp_path / "myplug" / "unrelated.py").write_text("X = 2\n")
    assert key() == first
    (tmp_path / "myplug" / "settings.py").write_text("LIMIT = 6\n")
    second = key()
    assert second != first
    (tmp_path / "myplug" / "helpers.py").write_text("def word(i):\n    return 'v' * i\n")
    assert key() not in (first, second)
    for name in [m for m in sys.modules if m.startswith("myplug")]:
        monkeypatch.delitem(sys.modules, name)
