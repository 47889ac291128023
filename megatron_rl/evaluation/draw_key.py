"""What a domain's draws depend on, as digests: the prompt-set cache's key (``prompt_cache.py``).

A draw is ``Domain.task(split, index, level, seed)``: the domain's code, the settings it was built
with, and the module-level settings its code reads. The key covers all three, for every domain:

* :func:`code_version`: the SHA-256 of the source of every module the domain's draws can run,
  found by following imports (at module level and inside functions) from the modules of the
  domain's class and its bases, of the entry point's factory that built it, and of
  ``megatron_rl/domains/base.py`` / ``draws.py`` (how draws are made); plus the names and
  versions of every installed distribution. Imports are followed through first-party code (the
  repository's packages, editable installs); the standard library and installed distributions
  are covered by the Python version and the distribution versions instead. So a setting in a
  helper module (``domains/ladders.py`` for ``ladder/*``, built by ``domains/tiny.py`` with the
  class of ``domains/tiny_domain.py``) is part of the key.
* :func:`params_digest`: the domain object's own resolved settings (its instance attributes:
  a rung's config, a task file's rows; a ``cached_property`` such as a built dataset is left
  out) and the values of the UPPER_CASE plain-data constants of every module above that is
  imported at import time (always loaded, so the key is the same before and after a draw), so a
  setting rebound at run time (a test's monkeypatch, a factory that replaces a table) is in the
  key too (a table edited in place is seen through the domains that hold it, as a rung holds its
  config).
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import hashlib
import importlib.machinery
import importlib.util
import json
import sys
import sysconfig
from functools import cache, cached_property
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any

from megatron_rl.domains import Domain

GROUP = "megatron_rl.domains"  # the entry-point group the registry loads plugins from
_DEPTH = 4  # how deep an object's attributes are followed into for its digest
# module -> ((name, id) of its UPPER_CASE globals, digest of their values): :func:`_constants`
_CONSTANTS: dict[str, tuple[tuple[tuple[str, int], ...], str]] = {}


@cache
def _file_sha(path: str) -> str:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return "missing"


@cache
def _distributions() -> str:
    pairs = sorted(f"{d.metadata['Name']}=={d.version}" for d in metadata.distributions())
    pairs.append(f"python=={sys.version}")
    return hashlib.sha256("\n".join(pairs).encode()).hexdigest()


@cache
def _installed_roots() -> tuple[str, ...]:
    """Folders whose modules come from the standard library or an installed distribution."""
    keys = ("stdlib", "platstdlib", "purelib", "platlib")
    roots = {str(Path(p).resolve()) for k in keys if (p := sysconfig.get_paths().get(k))}
    return tuple(sorted(roots))


def _first_party(path: str) -> bool:
    p = str(Path(path).resolve())
    return not any(p.startswith(root + "/") for root in _installed_roots())


@cache
def _locate(name: str) -> tuple[str | None, tuple[str, ...] | None] | None:
    """``(file, package folders)`` of module ``name``, found without importing anything (a
    submodule is looked up in its parent's folders); None when it is no module (a name in a
    module: ``from a.b import c``)."""
    mod = sys.modules.get(name)
    if mod is not None:
        folders = getattr(mod, "__path__", None)
        return getattr(mod, "__file__", None), tuple(folders) if folders is not None else None
    parent, _, last = name.rpartition(".")
    try:
        if not parent:
            spec = importlib.util.find_spec(name)  # a top-level name: finds, runs nothing
        else:
            where = _locate(parent)
            if where is None or where[1] is None:
                return None
            spec = importlib.machinery.PathFinder.find_spec(last, list(where[1]))
    except (ImportError, ValueError, AttributeError):
        return None
    if spec is None:
        return None
    folders = spec.submodule_search_locations
    origin = spec.origin if spec.has_location else None
    return origin, tuple(folders) if folders is not None else None


@cache
def _source_of(name: str) -> str | None:
    """The ``.py`` file of module ``name`` when it is first-party code, else None (builtin,
    standard library, installed distribution, or not a module at all)."""
    top = name.partition(".")[0]
    if top in sys.stdlib_module_names or top in sys.builtin_module_names:
        return None
    where = _locate(top)
    if where is None:
        return None
    places = [p for p in (where[0], *(where[1] or ())) if p]
    if not places or not all(_first_party(p) for p in places):
        return None  # an installed distribution (its version is in the key)
    where = _locate(name)
    path = where[0] if where is not None else None
    if not path or not path.endswith(".py") or not _first_party(path):
        return None
    return str(path)


def _import_nodes(node: ast.AST, eager: bool) -> list[ast.Import | ast.ImportFrom]:
    """The import statements under ``node``; ``eager``: only those that run when the module is
    imported (not inside a function, nor under ``if TYPE_CHECKING:``)."""
    out: list[ast.Import | ast.ImportFrom] = []
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Import | ast.ImportFrom):
            out.append(child)
        elif eager and isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            continue
        elif eager and isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
            out.extend(n for c in child.orelse for n in _import_nodes(c, eager))
        else:
            out.extend(_import_nodes(child, eager))
    return out


@cache
def _imports_of(name: str, path: str, eager: bool) -> tuple[str, ...]:
    """Every module name an import statement of ``path`` (module ``name``) may name."""
    try:
        tree = ast.parse(Path(path).read_text())
    except (OSError, SyntaxError, ValueError):
        return ()
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    found: set[str] = set()
    for node in _import_nodes(tree, eager):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
            continue
        base = node.module or ""
        if node.level:
            parts = package.split(".")
            parts = parts[: len(parts) - node.level + 1]
            base = ".".join([*parts, base] if base else parts)
        found.add(base)
        found.update(f"{base}.{a.name}" for a in node.names)
    return tuple(sorted(n for n in found if n))


@cache
def _closure(seeds: tuple[str, ...], eager: bool) -> tuple[tuple[str, str], ...]:
    """``(module, file)`` for every first-party module reachable by import from ``seeds``;
    ``eager``: by the imports that run at import time only (so all of them are loaded once the
    seeds are)."""
    seen: dict[str, str] = {}
    todo = list(seeds)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        path = _source_of(name)
        if path is None:
            continue
        seen[name] = path
        todo.extend(n for n in _imports_of(name, path, eager) if n not in seen)
    return tuple(sorted(seen.items()))


@cache
def _factory_module(plugin: str) -> str | None:
    """The module of the entry point ``plugin`` (the factory that built its domains)."""
    for ep in metadata.entry_points(group=GROUP, name=plugin):
        return ep.module
    return None


def draw_modules(domain: Domain, eager: bool = False) -> tuple[tuple[str, str], ...]:
    """``(module, file)`` of every first-party module ``domain``'s draws may run; ``eager``:
    those its modules import at import time (loaded whenever the domain exists)."""
    from megatron_rl.domains import base, draws

    seeds = {c.__module__ for c in type(domain).__mro__ if c is not object}
    seeds |= {base.__name__, draws.__name__}
    factory = _factory_module(domain.plugin) if domain.plugin else None
    if factory:
        seeds.add(factory)
    return _closure(tuple(sorted(seeds)), eager)


def code_version(domain: Domain) -> str | None:
    """The version of the code that draws ``domain``'s tasks; None: not cacheable (a domain
    of a task file given to the run, whose reading is already quick)."""
    if not domain.plugin:
        return None
    files = draw_modules(domain)
    if not any(m == type(domain).__module__ for m, _ in files):
        return None  # its class's source is not to be found: no version to key on
    parts = [f"{m}={_file_sha(f)}" for m, f in files]
    return hashlib.sha256("|".join([*parts, _distributions()]).encode()).hexdigest()[:20]


def canonical(value: Any, depth: int = 0) -> Any:
    """A JSON-able form of ``value`` that is the same in every process for equal settings
    (sorted sets and dicts; an object by its class and, a few levels deep, its attributes)."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return ["float", repr(value)]  # nan and inf too
    if isinstance(value, enum.Enum):
        return ["enum", type(value).__qualname__, canonical(value.value, depth)]
    if isinstance(value, list | tuple):
        return [type(value).__name__, [canonical(v, depth) for v in value]]
    if isinstance(value, set | frozenset):
        return ["set", sorted(json.dumps(canonical(v, depth)) for v in value)]
    if isinstance(value, dict):
        items = sorted(
            (json.dumps(canonical(k, depth)), canonical(v, depth)) for k, v in value.items()
        )
        return ["dict", [list(kv) for kv in items]]
    if isinstance(value, Path):
        return ["path", str(value)]
    if isinstance(value, bytes):
        return ["bytes", hashlib.sha256(value).hexdigest()]
    kind = type(value)
    name = f"{kind.__module__}.{kind.__qualname__}"
    if isinstance(value, type | ModuleType) or callable(value):
        qual = getattr(value, "__qualname__", getattr(value, "__name__", ""))
        return ["code", getattr(value, "__module__", ""), qual]
    if depth >= _DEPTH:
        return ["object", name]
    if dataclasses.is_dataclass(value):
        fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        return ["object", name, canonical(fields, depth + 1)]
    if hasattr(value, "__dict__"):
        return ["object", name, canonical(_own_state(value), depth + 1)]
    return ["object", name]


def _own_state(obj: Any) -> dict[str, Any]:
    """An object's instance attributes, without what a ``cached_property`` computed."""
    kind = type(obj)
    return {
        k: v
        for k, v in vars(obj).items()
        if not isinstance(getattr(kind, k, None), cached_property | property)
    }


def _constants(module: ModuleType) -> str:
    """A digest of the module's UPPER_CASE settings that are plain data (tables, numbers,
    strings). Kept per module while each such name is bound to the same object, so a run of
    hundreds of domains hashes each table once; rebinding a name (a monkeypatch) recomputes."""
    names = tuple((k, id(v)) for k, v in vars(module).items() if k.isupper())
    hit = _CONSTANTS.get(module.__name__)
    if hit is not None and hit[0] == names:
        return hit[1]
    table = {k: canonical(v) for k, v in vars(module).items() if k.isupper() and _plain(v)}
    text = json.dumps(table, sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(text.encode()).hexdigest()
    _CONSTANTS[module.__name__] = (names, digest)
    return digest


def _plain(value: Any, depth: int = 0) -> bool:
    if value is None or isinstance(value, bool | int | float | str | bytes):
        return True
    if depth > 8:
        return False
    if isinstance(value, list | tuple | set | frozenset):
        return all(_plain(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return all(_plain(k, depth + 1) and _plain(v, depth + 1) for k, v in value.items())
    return False


def params_digest(domain: Domain) -> str:
    """A digest of ``domain``'s resolved settings and of its modules' current constants."""
    # the modules loaded whenever the domain is (the same set at every call, drawn or not)
    loaded = [m for m, _ in draw_modules(domain, eager=True) if m in sys.modules]
    consts = {m: _constants(sys.modules[m]) for m in loaded}
    state = [type(domain).__module__, type(domain).__qualname__, canonical(_own_state(domain))]
    text = json.dumps([state, consts], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:20]
