"""The tinysched/* domains of the scheduler benchmark: single-level, large prompt spaces (from
the committed measurement), and the constructed pair's conventions disagree on every item."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from domains.tiny_sched import OFFSETS, PAIR, SPECS
from megatron_rl.domains import load_domains

ROOT = Path(__file__).resolve().parents[2]


def test_registered_single_level_and_the_benchmark_sets_exist() -> None:
    names = set(load_domains(["tinysched/*"]))
    assert names == {f"tinysched/{n}" for n in SPECS} | {PAIR[0], *OFFSETS} and PAIR[1] in OFFSETS
    assert all(d.levels == (0,) for d in load_domains(["tinysched/*"]).values())
    from benchmarks.studies import scheduler_real as sr

    assert set(sr.DOMAINS) <= names and set(sr.D2) <= names and len(set(sr.D2)) == 12


def test_measured_prompt_spaces_are_large_enough() -> None:
    """benchmarks/studies/scheduler_domains.json: >= 1,000 distinct prompts per domain (estimated
    from collisions) and >= 128 distinct held-out prompts seen, for every benchmark domain."""
    doc = json.loads((ROOT / "benchmarks" / "studies" / "scheduler_domains.json").read_text())
    doc = doc["domains"]
    from benchmarks.studies import scheduler_real as sr

    for name in {*sr.DOMAINS, *sr.D2, *PAIR}:
        row = doc[name]
        assert row["total_size_est"] >= 1000, (name, row["total_size_est"])
        assert row["eval_distinct"] >= 128, (name, row["eval_distinct"])


def test_pair_asks_the_same_questions_and_disagrees_on_every_item() -> None:
    """Same question form from the same generator; the gold is the GCD under A and the GCD plus
    the offset under each other convention (plus 100 under B), so no answer scores under two."""
    names = [PAIR[0], *OFFSETS]
    doms = load_domains(names)
    offsets = {PAIR[0]: 0, **OFFSETS}
    assert offsets[PAIR[1]] == 100
    numbers = re.compile(r"numbers: (\d+), (\d+)\. Give only the GCD as your final answer\.$")
    for i in range(50):
        golds = {}
        for name in names:
            t = doms[name].task("eval", i, 0, seed=3)
            x, y = map(int, numbers.search(t.prompt).groups())
            assert int(t.gold) == math.gcd(x, y) + offsets[name]
            golds[name] = (t, math.gcd(x, y))
        for name, (t, g) in golds.items():
            for other, off in offsets.items():
                want = 1.0 if other == name else 0.0
                assert doms[name].verify(t, str(g + off)).score == want, (name, other)
