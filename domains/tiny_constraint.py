"""A constructed constraint for the tiny model (``tinycon/spell_no_e`` and its pair), labelled
as such.

The demo's spelling task (a 3-5 letter word backward, as ``tinywide/spell_backward``) with one
rule on top: the answer must not contain the letter ``e``. The task reward (1 for the exact
reversal) tempts the violation on every word that has an ``e``, whose right answer breaks the
rule; a reversal without ``e`` breaks nothing. A violating answer is reported as
``hard_violation`` (so the domain's floor applies when ``rewards.violation_floor`` is on) and the
domain declares the constraint, so ``rewards.constraints: {hard_violation: <budget>}`` prices it
with a Lagrange multiplier (megatron_rl/rewards/constraints.py). It exists for the constraint
experiment of issue 38 (docs/rewards.md); real constraints rarely conflict with the task this
plainly.

The experiment trains the pair that splits it: ``tinycon/spell_e_words`` (words with an ``e``:
every right answer breaks the rule, the temptation) and ``tinycon/spell_clean_words`` (words
without one: the task the rule leaves, whose accuracy is the task reward that should still rise).
Both declare the constraint, so the violation rate is taken over the samples of both.
"""

from __future__ import annotations

import random
from typing import Any

from domains.tiny_domain import TinyDomain
from megatron_rl.domains.base import Domain, Task

FORBIDDEN = "e"


class NoLetterDomain(TinyDomain):
    """Spelling backward, with answers that contain ``FORBIDDEN`` counted as violations;
    ``words``: "all", or only the words "with" or "without" the letter."""

    def __init__(self, name: str = "tinycon/spell_no_e", words: str = "all") -> None:
        if words not in ("all", "with", "without"):
            raise ValueError(f"words must be 'all', 'with' or 'without', got {words!r}")
        super().__init__("spell_backward", name, [{"min_word_len": 3, "max_word_len": 5}], {})
        self.constraints = ("hard_violation",)
        self.words = words

    def generate(self, level: int, rng: random.Random) -> tuple[str, str, dict[str, Any]]:
        while True:  # about half the words have the letter: a few draws at most
            prompt, gold, meta = super().generate(level, rng)
            if self.words == "all" or (FORBIDDEN in gold.lower()) == (self.words == "with"):
                return prompt, gold, meta

    def score(self, task: Task, answer: str) -> tuple[float, dict[str, Any]]:
        score, details = super().score(task, answer)
        details["hard_violation"] = FORBIDDEN in answer.lower()
        return score, details


def constraint_domains() -> list[Domain]:
    return [
        NoLetterDomain(),
        NoLetterDomain("tinycon/spell_e_words", "with"),
        NoLetterDomain("tinycon/spell_clean_words", "without"),
    ]
