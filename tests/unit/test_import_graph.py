"""The import graph of the code (issues 36 and 53): no circles, one direction between packages.

Every import statement counts: the lazy ones inside functions (a lazy import that dodges a
circle at run time is still a circle for the reader) and those under ``if TYPE_CHECKING:``
(a type named back up the graph ties the two files for the reader as much as a call does).
``from a.b import c`` is an edge to ``a/b/c.py`` when that is a module, else to ``a/b.py`` (or
``a/b/__init__.py``). The directions kept (docs/layout.md draws the order; DESIGN and each
package's docstring give the reasons):

- no circle between files, anywhere the walk goes;
- no two parts of ``megatron_rl/`` import each other, and no longer circle joins them: a part is
  a folder (``megatron_rl/rollout/``) or a module at the top (``megatron_rl/losses.py``);
- ``long_context/`` imports ``megatron_rl/``, never the reverse: packing and context
  parallelism run in every step, so they are library code (``megatron_rl/packing/``,
  ``megatron_rl/model/cp/``); long_context/ holds the long-context tasks and data.
- the library (``megatron_rl/``, ``long_context/``, ``domains/``, ``launch/``) never imports
  ``benchmarks/``; a study (``benchmarks/studies/``) may import the library and the harness.
- of ``megatron_rl/train/`` (what trainer ranks run) only the loop imports the controller.

docs/layout.md has the table of packages.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WALKED = ("megatron_rl", "long_context", "domains", "benchmarks", "launch")
LIBRARY = ("megatron_rl", "long_context", "domains", "launch")


def module_files(root: Path, packages: Iterable[str]) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` under ``packages`` (``__init__`` as the
    package itself)."""
    out: dict[str, Path] = {}
    for pkg in packages:
        for f in sorted((root / pkg).rglob("*.py")):
            parts = list(f.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = f
    return out


def _imported(tree: ast.AST, name: str, is_pkg: bool) -> set[str]:
    """Every module name an import statement in ``tree`` names (candidates, not yet resolved)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this module's package
                pkg = name.split(".") if is_pkg else name.split(".")[:-1]
                pkg = pkg[: len(pkg) - node.level + 1]
                base = ".".join([*pkg, base] if base else pkg)
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)
    return found


def import_graph(root: Path, packages: Iterable[str]) -> dict[str, set[str]]:
    """Module -> the modules of ``packages`` it imports (edges to itself dropped)."""
    files = module_files(root, packages)
    graph: dict[str, set[str]] = {}
    for name, f in files.items():
        edges: set[str] = set()
        for cand in _imported(ast.parse(f.read_text()), name, f.name == "__init__.py"):
            if cand in files:
                # ``from a.b import c``: the submodule a.b.c when it is one, else a.b itself
                parent = cand.rsplit(".", 1)[0]
                if parent in files and cand not in files:
                    cand = parent
                edges.add(cand)
        # ``from a.b import c`` also named a.b; keep it only when c was not a submodule
        graph[name] = {e for e in edges if e != name}
    for name, edges in graph.items():
        subs = {e for e in edges if any(o.startswith(e + ".") for o in edges)}
        graph[name] = edges - {s for s in subs if files[s].name == "__init__.py"}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on.add(start)
        while work:
            node, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in graph:
                    continue
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                elif nxt in on:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    m = stack.pop()
                    on.discard(m)
                    comp.append(m)
                    if m == node:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def crossing(graph: dict[str, set[str]], src: str, dst: str) -> list[str]:
    """``a -> b`` for every edge from a module of package ``src`` into package ``dst``."""
    inside = lambda m, p: m == p or m.startswith(p + ".")
    return sorted(
        f"{a} -> {b}" for a, bs in graph.items() if inside(a, src) for b in bs if inside(b, dst)
    )


def part_of(module: str, root: str = "megatron_rl") -> str | None:
    """The part of package ``root`` that ``module`` belongs to: its folder under ``root``
    (``megatron_rl.rollout``) or a module at the top (``megatron_rl.losses``); None outside."""
    names = module.split(".")
    return ".".join(names[:2]) if names[0] == root else None


def part_graph(graph: dict[str, set[str]], root: str = "megatron_rl") -> dict[str, set[str]]:
    """Part -> the other parts of ``root`` that its modules import."""
    parts: dict[str, set[str]] = {}
    for a, bs in graph.items():
        pa = part_of(a, root)
        if pa is not None:
            parts.setdefault(pa, set()).update(
                pb for b in bs if (pb := part_of(b, root)) is not None and pb != pa
            )
    return parts


def mutual(graph: dict[str, set[str]], parts: dict[str, set[str]]) -> list[str]:
    """``a <-> b`` for every two parts that import each other, with the edges each way."""
    return [
        f"{a} <-> {b}: " + "; ".join(crossing(graph, a, b) + crossing(graph, b, a))
        for a in sorted(parts)
        for b in sorted(parts[a])
        if a < b and a in parts.get(b, set())
    ]


GRAPH = import_graph(ROOT, WALKED)
# Circles left on purpose, each with why and what removes it (none now).
PENDING: list[list[str]] = []


def test_no_import_circle() -> None:
    found = [c for c in circles(GRAPH) if c not in PENDING]
    assert not found, "import circles (lazy and TYPE_CHECKING imports included):\n" + "\n".join(
        " <-> ".join(c) for c in found
    )


def test_no_two_parts_of_the_library_import_each_other() -> None:
    """The folders (and top-level modules) of ``megatron_rl/`` import one way: no pair imports
    each other, and no longer circle runs through them (docs/layout.md draws the order)."""
    parts = part_graph(GRAPH)
    assert {"megatron_rl.controller", "megatron_rl.train", "megatron_rl.config"} <= set(parts)
    pairs = mutual(GRAPH, parts)
    assert not pairs, "parts that import each other:\n" + "\n".join(pairs)
    found = circles(parts)
    assert not found, "circles of parts:\n" + "\n".join(" -> ".join(c) for c in found)


def test_long_context_and_the_library_import_one_way() -> None:
    assert crossing(GRAPH, "long_context", "megatron_rl"), "the walk found no edge at all"
    assert not crossing(GRAPH, "megatron_rl", "long_context")


def test_the_library_never_imports_benchmarks_or_a_study() -> None:
    for pkg in LIBRARY:
        assert not crossing(GRAPH, pkg, "benchmarks"), pkg


def test_the_trainer_side_knows_no_controller_but_the_loop() -> None:
    """Trainer ranks run train/: only the loop (train/rl.py) builds the controller, on rank 0."""
    edges = crossing(GRAPH, "megatron_rl.train", "megatron_rl.controller")
    assert edges and all(e.startswith("megatron_rl.train.rl ->") for e in edges), edges


def test_the_checks_see_a_lazy_circle_and_a_wrong_way_edge(tmp_path: Path) -> None:
    """The walk itself: a circle closed by a lazy, function-level import is found, and so is an
    edge against the kept direction (so the tests above can fail)."""
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "__init__.py").write_text("")
    (tmp_path / "lib" / "a.py").write_text("from lib.b import f\n")
    (tmp_path / "lib" / "b.py").write_text("def f():\n    from lib import a\n    return a\n")
    (tmp_path / "feat").mkdir()
    (tmp_path / "feat" / "__init__.py").write_text("")
    (tmp_path / "feat" / "x.py").write_text("from lib.a import f\n")
    (tmp_path / "lib" / "c.py").write_text("import feat.x\n")
    (tmp_path / "lib" / "d.py").write_text(  # a type-only import counts too
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from feat.x import f\n"
    )
    graph = import_graph(tmp_path, ["lib", "feat"])
    assert circles(graph) == [["lib.a", "lib.b"]]
    assert crossing(graph, "lib", "feat") == ["lib.c -> feat.x", "lib.d -> feat.x"]
    assert crossing(graph, "feat", "lib") == ["feat.x -> lib.a"]


def test_the_checks_see_two_parts_that_import_each_other(tmp_path: Path) -> None:
    """Two folders tied both ways without a circle of files (one way a type only) are a pair;
    a third joining them in a longer loop is a circle of parts."""
    for folder in ("lib", "lib/x", "lib/y", "lib/z"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "__init__.py").write_text("")
    (tmp_path / "lib" / "x" / "a.py").write_text("from lib.y import b\n")
    (tmp_path / "lib" / "y" / "b.py").write_text("import lib.z.e\n")
    (tmp_path / "lib" / "y" / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from lib.x.d import f\n"
    )
    (tmp_path / "lib" / "x" / "d.py").write_text("f = 1\n")
    (tmp_path / "lib" / "z" / "e.py").write_text("def g():\n    from lib.x import d\n")
    graph = import_graph(tmp_path, ["lib"])
    assert circles(graph) == []
    parts = part_graph(graph, "lib")
    assert mutual(graph, parts) == ["lib.x <-> lib.y: lib.x.a -> lib.y.b; lib.y.c -> lib.x.d"]
    assert circles(parts) == [["lib.x", "lib.y", "lib.z"]]
