"""The README stays a five-minute read that points at files that exist (issue 53)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def test_the_readme_is_short_and_its_table_cells_are_one_line_each() -> None:
    assert len(README.split()) <= 1250, len(README.split())
    cells = [
        c.strip() for line in README.splitlines() if line.startswith("|") for c in line.split("|")
    ]
    assert cells and max(len(c) for c in cells) <= 200, max(cells, key=len)


def test_every_path_the_readme_names_exists() -> None:
    named = set(
        re.findall(r"`((?:megatron_rl|launch|slurm|configs|docs|models)/[\w./-]+)`", README)
    )
    named |= set(re.findall(r"\]\(((?:docs|benchmarks)/[\w./-]+)", README))  # links
    named |= set(re.findall(r"\b(docs/[\w-]+\.md)\b", README))
    assert len(named) >= 10, named
    missing = sorted(p for p in named if not (ROOT / p.split("#")[0]).exists())
    assert not missing, missing


def test_the_read_the_code_list_has_six_to_eight_files() -> None:
    section = README.split("## Read the code", 1)[1].split("\n## ", 1)[0]
    files = re.findall(r"^\d+\. `([\w/.]+\.py)`", section, flags=re.M)
    assert 6 <= len(files) <= 8, files
    assert all((ROOT / f).is_file() for f in files), files
