"""Easy procedural tasks sized for the tiny CPU demo policy (``tiny/<generator>``).

These are reasoning-gym generators with explicit small configurations per difficulty level
(reasoning-gym's own curriculum level 0 is already beyond a ~1M-parameter byte-level model for
most generators). Unlike the ``rg/`` family, each domain carries all its levels, so the
scheduler's curriculum can promote it from level 0 to 2. Scoring is reasoning-gym's own
``score_answer`` made all-or-nothing (partial credit for near misses would reward garbage).
The shipped tiny base model was trained on these domains (``configs/base_sft.yaml``).
"""

from __future__ import annotations

import random
from functools import cached_property
from typing import Any

from megatron_rl.domains.base import Domain, Task

POOL_SIZE = 50_000  # virtual dataset size per level; a task picks an index from its seed
# scored by exact match (case-insensitive): reasoning-gym's spell_backward scorer gives 1.0 to
# the right word followed by anything when the word has 9, 11, 18 or 20 letters (domains/rg.py)
EXACT = frozenset({"spell_backward"})

# generator -> per-level reasoning-gym config overrides (level 0 easiest)
CONFIGS: dict[str, list[dict[str, Any]]] = {
    "chain_sum": [
        {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1},
        {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2},
        {"min_terms": 3, "max_terms": 3, "min_digits": 1, "max_digits": 2},
    ],
    "basic_arithmetic": [
        {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1},
        {"min_terms": 3, "max_terms": 3, "min_digits": 1, "max_digits": 1},
        {"min_terms": 2, "max_terms": 2, "min_digits": 2, "max_digits": 2},
    ],
    "spell_backward": [
        {"min_word_len": 3, "max_word_len": 4},
        {"min_word_len": 5, "max_word_len": 6},
        {"min_word_len": 7, "max_word_len": 8},
    ],
    "letter_counting": [
        {"min_words": 1, "max_words": 2},
        {"min_words": 3, "max_words": 4},
        {"min_words": 5, "max_words": 7},
    ],
    "count_bits": [
        {"min_n": 1, "max_n": 63},
        {"min_n": 1, "max_n": 255},
        {"min_n": 1, "max_n": 4095},
    ],
}
# settings every level of a generator shares
COMMON: dict[str, dict[str, Any]] = {
    "basic_arithmetic": {
        "operators": ("+", "-"),
        "allow_parentheses": False,
        "allow_negation": False,
    },
}


class TinyDomain(Domain):
    """One reasoning-gym generator with demo-sized levels."""

    family = "tiny"
    tier = "core"
    time_budget_s = 1.0

    def __init__(
        self,
        generator: str,
        name: str | None = None,
        configs: list[dict[str, Any]] | None = None,
        common: dict[str, Any] | None = None,
    ) -> None:
        self.generator = generator
        self.name = name or f"tiny/{generator}"
        self.family = self.name.split("/", 1)[0]
        self.configs = configs if configs is not None else CONFIGS[generator]
        self.common = common if common is not None else COMMON.get(generator, {})
        self.levels = tuple(range(len(self.configs)))
        self.tags = (self.name.split("/", 1)[0], "reasoning_gym")

    @cached_property
    def datasets(self) -> list[Any]:
        import reasoning_gym

        return [
            reasoning_gym.create_dataset(
                self.generator,
                seed=level,
                size=POOL_SIZE,
                **{**self.common, **cfg},
            )
            for level, cfg in enumerate(self.configs)
        ]

    def generate(self, level: int, rng: random.Random) -> tuple[str, str, dict[str, Any]]:
        index = rng.randrange(POOL_SIZE)
        entry = self.datasets[level][index]
        return str(entry["question"]), str(entry["answer"]), {"index": index}

    def score(self, task: Task, answer: str) -> tuple[float, dict[str, Any]]:
        if self.generator in EXACT:  # the word itself, not reasoning-gym's prefix credit
            return float(answer.strip().lower() == task.gold.strip().lower()), {}
        ds = self.datasets[task.level]
        raw = float(ds.score_answer(answer, ds[task.meta["index"]]))
        return (1.0 if raw >= 1.0 else 0.0), {"rg_score": raw}
