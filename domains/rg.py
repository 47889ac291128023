"""Procedural reasoning domains from the ``reasoning-gym`` package: one per (generator, level).

Names are ``rg/<generator>@<level>``: each reasoning-gym curriculum level becomes its own domain
(``levels == (level,)``), so the domain scheduler can weight and temperature-tune them apart;
``Domain.group`` (``rg/<generator>``) ties the levels of one generator together for a
curriculum. Levels are reasoning-gym's own global curriculum levels (0 = its easiest config);
generators without a curriculum give one domain at level 0 with their default config.

Prompts are the generator's question text alone (short and plain, as the tiny demo policy needs).
Scoring is reasoning-gym's own ``score_answer``, with three deviations, all so that the outcome
reward means "correct" and formatting credit is left to the reward composer:

- scores under ``MIN_CREDIT`` (reasoning-gym's 0.01-0.05 "you answered something") become 0;
- generators whose partial credit is string similarity (``SIMILARITY_SCORED``) are scored
  all-or-nothing, otherwise garbage earns up to a third of the reward;
- ``game_of_life_halting`` is scored by exact match: its scorer gives 1.0 to any text that is
  not "True" (measured with reasoning-gym 0.1.25), which would pay a reward hacker;
- so is ``spell_backward``: its scorer adds ``1 / len`` per matching position and takes 0.2
  off a prefix match only when the sum equals 1.0 exactly, which in floating point it does not
  for 9, 11, 18 or 20 letters (the sum is 1.0000000000000002): there the right word followed by
  anything scored 1.0 (found 2026-12-05 by the ladders' test).

Generators and levels left out (measured with reasoning-gym 0.1.25, see ``SKIPPED``): those
with no single gold answer (``answer`` is None, the scorer validates a solution instead) and
levels whose curriculum config fails its own validation or generates one task in > 2 s.
"""

from __future__ import annotations

import random
from functools import cached_property
from typing import Any

from megatron_rl.domains.base import Domain, Task

LEVELS = (0, 1, 2, 3)  # reasoning-gym global curriculum levels exposed as domains
POOL_SIZE = 100_000  # virtual dataset size; a task picks an index in it from its seed
# generators that precompute per item or reject large sizes (measured: acre 7 s at 10k)
POOL_SIZE_OVERRIDES = {"acre": 1_000, "word_ladder": 10_000}
MIN_CREDIT = 0.1  # rg scores below this ("answer present but wrong") count as 0
SIMILARITY_SCORED = frozenset({"figlet_font", "spell_backward", "palindrome_generation"})
EXACT_SCORED = frozenset({"game_of_life_halting", "spell_backward"})
# generator -> reason, or (generator, level) -> reason
SKIPPED: dict[Any, str] = {
    "composite": "meta-dataset of other generators",
    "codeio": "execs its stored programs in-process (they print) and is not deterministic",
    "boxnet": "no gold answer",
    "graph_color": "no gold answer",
    "propositional_logic": "no gold answer",
    "rubiks_cube": "no gold answer",
    "rush_hour": "no gold answer",
    "knight_swap": "curriculum configs fail validation (min_nodes)",
    ("caesar_cipher", 2): "config fails validation (rotation)",
    ("caesar_cipher", 3): "config fails validation (rotation)",
    ("modulo_grid", 1): "config fails validation (max_target)",
    ("survo", 2): "config fails validation (max_empty)",
    ("survo", 3): "config fails validation (max_empty)",
    ("jugs", 1): "gold is sometimes 'No solution', which its own scorer gives 0",
    ("jugs", 2): "gold sometimes scores 0; ~4 s per task",
    ("jugs", 3): "gold sometimes scores 0; slow",
    ("sokoban", 0): "~4.5 s per task",
    ("game_of_life_halting", 2): "numpy elides the board in the prompt ('...'): unanswerable",
    ("game_of_life_halting", 3): "numpy elides the board in the prompt ('...'): unanswerable",
}
CORE = frozenset(
    {
        "basic_arithmetic",
        "chain_sum",
        "gsm_symbolic",
        "number_sorting",
        "letter_counting",
        "spell_backward",
        "word_sorting",
        "gcd",
        "lcm",
        "simple_equations",
        "fraction_simplification",
        "count_bits",
    }
)


class ReasoningGymDomain(Domain):
    """One reasoning-gym generator at one curriculum level."""

    family = "rg"
    time_budget_s = 2.0

    def __init__(self, generator: str, level: int, category: str, curriculum: bool) -> None:
        self.generator = generator
        self.level = level
        self.curriculum = curriculum
        self.name = f"rg/{generator}@{level}"
        self.group = f"rg/{generator}"
        self.levels = (level,)
        self.tags = ("reasoning_gym", category)
        self.tier = "core" if generator in CORE and level <= 1 else "long_tail"

    @property
    def pool_size(self) -> int:
        return POOL_SIZE_OVERRIDES.get(self.generator, POOL_SIZE)

    @cached_property
    def dataset(self) -> Any:
        """The reasoning-gym dataset for this level (built on first use; ~0-0.4 s)."""
        from reasoning_gym.factory import DATASETS, create_curriculum

        ds_cls, cfg_cls = DATASETS[self.generator]
        if self.curriculum:
            cur = create_curriculum(self.generator)
            cur.set_global_level(self.level)
            cfg = cur.generate_configuration({"seed": 0, "size": self.pool_size})
        else:
            cfg = cfg_cls(seed=0, size=self.pool_size)
        return ds_cls(config=cfg)

    def generate(self, level: int, rng: random.Random) -> tuple[str, str, dict[str, Any]]:
        entry = self.dataset[rng.randrange(self.pool_size)]
        return str(entry["question"]), str(entry["answer"]), {"rg_entry": entry}

    def score(self, task: Task, answer: str) -> tuple[float, dict[str, Any]]:
        if self.generator in EXACT_SCORED:
            return float(answer.strip().lower() == task.gold.strip().lower()), {}
        raw = float(self.dataset.score_answer(answer, task.meta["rg_entry"]))
        score = raw if raw >= MIN_CREDIT else 0.0
        if self.generator in SIMILARITY_SCORED:
            score = 1.0 if raw >= 1.0 else 0.0
        return score, {"rg_score": raw}


def domains() -> list[Domain]:
    """Entry point: every usable (generator, level) of the installed reasoning-gym."""
    from reasoning_gym.factory import DATASETS, has_curriculum

    out: list[Domain] = []
    for gen in sorted(DATASETS):
        if gen in SKIPPED:
            continue
        category = DATASETS[gen][0].__module__.split(".")[1]
        curriculum = has_curriculum(gen)
        for level in LEVELS if curriculum else (0,):
            if (gen, level) not in SKIPPED:
                out.append(ReasoningGymDomain(gen, level, category, curriculum))
    return out
