"""A constructed constraint for the tiny model (``tinycon/spell_no_e``), labelled as such.

The demo's spelling task (a 3-5 letter word backward, as ``tinywide/spell_backward``) with one
rule on top: the answer must not contain the letter ``e``. The task reward (1 for the exact
reversal) tempts the violation on every word that has an ``e``, whose right answer breaks the
rule; a reversal without ``e`` breaks nothing. A violating answer is reported as
``hard_violation`` (so the domain's floor applies when ``rewards.violation_floor`` is on) and the
domain declares the constraint, so ``rewards.constraints: {hard_violation: <budget>}`` prices it
with a Lagrange multiplier (megatron_rl/rewards/constraints.py). It exists for the constraint
experiment of issue 38 (docs/rewards.md); real constraints rarely conflict with the task this
plainly.
"""

from __future__ import annotations

from typing import Any

from domains.tiny_domain import TinyDomain
from megatron_rl.domains.base import Domain, Task

FORBIDDEN = "e"


class NoLetterDomain(TinyDomain):
    """Spelling backward, with answers that contain ``FORBIDDEN`` counted as violations."""

    def __init__(self) -> None:
        super().__init__(
            "spell_backward", "tinycon/spell_no_e", [{"min_word_len": 3, "max_word_len": 5}], {}
        )
        self.constraints = ("hard_violation",)

    def score(self, task: Task, answer: str) -> tuple[float, dict[str, Any]]:
        score, details = super().score(task, answer)
        details["hard_violation"] = FORBIDDEN in answer.lower()
        return score, details


def constraint_domains() -> list[Domain]:
    return [NoLetterDomain()]
