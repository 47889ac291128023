"""The house rules of the re-layout (issue 36) that the import graph does not cover.

- Files of at most 400 lines in the library, long_context/, the plugins and benchmarks/
  (STYLE: files of 100-400 lines; a longer file is split along a seam).
- Config reaches a function typed: no parameter of ``megatron_rl/`` is a ``cfg: Any`` /
  ``rl: Any``, and no ``# fmt: skip`` in the library, launch/, long_context/ or the plugins
  keeps a run of positional scalars on one line.
- Benchmarks run as modules (``python -m benchmarks...``): none edits ``sys.path``.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SIZED = ("megatron_rl", "long_context", "domains", "benchmarks")
LIBRARY = ("megatron_rl", "long_context", "domains", "launch")
MAX_LINES = 400


def files(*packages: str) -> list[Path]:
    return sorted(p for pkg in packages for p in (ROOT / pkg).rglob("*.py"))


def untyped_config_params(tree: ast.AST) -> list[str]:
    """``name:line`` of every parameter named cfg/rl and annotated ``Any``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            a = node.args
            for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs]:
                ann = ast.unparse(arg.annotation) if arg.annotation else ""
                if arg.arg in ("cfg", "rl") and ann in ("Any", "typing.Any"):
                    found.append(f"{node.name}:{node.lineno}")
    return found


def test_files_are_at_most_400_lines() -> None:
    long = {
        str(p.relative_to(ROOT)): n
        for p in files(*SIZED)
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not long, long


def test_the_library_takes_typed_config() -> None:
    untyped = [
        f"{p.relative_to(ROOT)} {f}"
        for p in files("megatron_rl")
        for f in untyped_config_params(ast.parse(p.read_text()))
    ]
    assert not untyped, untyped


def test_no_format_skip_in_the_library() -> None:
    skips = [
        f"{p.relative_to(ROOT)}:{i}"
        for p in files(*LIBRARY)
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if "fmt: skip" in line
    ]
    assert not skips, skips


def test_no_benchmark_edits_the_import_path() -> None:
    edits = [str(p.relative_to(ROOT)) for p in files("benchmarks") if "sys.path" in p.read_text()]
    assert not edits, edits


def test_the_checks_see_an_untyped_config() -> None:
    tree = ast.parse(
        "from typing import Any\ndef f(cfg: Any, x: int) -> None: ...\n"
        "def g(cfg: 'RunConfig') -> None: ...\n"
    )
    assert untyped_config_params(tree) == ["f:2"]
