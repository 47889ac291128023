"""More tiny-model domains (``tinymix/<name>``) for the domain-scheduler benchmark.

The demo's four ``tiny/*`` domains are too few, and too alike, for a mix to matter. These add
reasoning-gym generators at small configurations: variants of the generators the shipped base
model was trained on (harder or easier than its training distribution) plus new generators it
never saw. Only domains where the shipped base model has some signal (pass@8 at T=1 well above
0, see ``benchmarks/studies/tiny_headroom.py`` and docs/domains.md) are registered; the candidates
that measured ~0 are kept in ``NEEDS_RETRAINING`` so they are not forgotten.

The constructed interfering pair
    ``tinymix/add`` and ``tinymix/add_last_digit`` ask the *same* questions from the same
    generator and seed ("Calculate 7 + 8.") under conflicting answer conventions: the full sum
    ("15") vs only its last digit ("5"). They agree when the sum is below 10 and conflict
    otherwise. A policy cannot tell the two apart from the prompt, so reinforcing one convention
    on sums >= 10 necessarily un-learns the other: real, not simulated, interference. Real
    domains rarely conflict this cleanly; the pair exists so that the seesaw guard has a
    regression to catch in a real run (docs/scheduler.md), and is labelled as constructed.
    Measured with the shipped base model, the two greedy held-out curves still move together
    (docs/scheduler.md): the conflict does not show as a seesaw at this size.
"""

from __future__ import annotations

from typing import Any

from domains.tiny_domain import TinyDomain
from megatron_rl.domains.base import Domain, Task

ADD_ONLY = {"operators": ("+",), "allow_parentheses": False, "allow_negation": False}
SUB_ONLY = {"operators": ("-",), "allow_parentheses": False, "allow_negation": False}
ONE_DIGIT = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}

# name -> (generator, per-level configs (level 0 easiest), settings shared by all levels)
SPECS: dict[str, tuple[str, list[dict[str, Any]], dict[str, Any]]] = {
    "add": ("basic_arithmetic", [ONE_DIGIT], ADD_ONLY),
    "sub": ("basic_arithmetic", [ONE_DIGIT], SUB_ONLY),
    "add_2digit": (
        "basic_arithmetic",
        [{"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2}],
        ADD_ONLY,
    ),
    "chain_sum_3terms": (
        "chain_sum",
        [{"min_terms": 3, "max_terms": 3, "min_digits": 1, "max_digits": 1}],
        {},
    ),
    "count_bits_4bit": ("count_bits", [{"min_n": 1, "max_n": 15}], {}),
    "count_bits_8bit": ("count_bits", [{"min_n": 64, "max_n": 255}], {}),
    "letter_counting_2words": ("letter_counting", [{"min_words": 2, "max_words": 3}], {}),
    "count_bits_5bit": ("count_bits", [{"min_n": 16, "max_n": 31}], {}),
    "gcd_small": (
        "gcd",
        [{"min_numbers": 2, "max_numbers": 2, "min_value": 1, "max_value": 6}],
        {},
    ),
    "letter_counting_long": ("letter_counting", [{"min_words": 3, "max_words": 5}], {}),
    "spell_backward_3": ("spell_backward", [{"min_word_len": 3, "max_word_len": 3}], {}),
    "gcd": ("gcd", [{"min_numbers": 2, "max_numbers": 2, "min_value": 1, "max_value": 12}], {}),
    "lcm": ("lcm", [{"min_numbers": 2, "max_numbers": 2, "min_value": 1, "max_value": 6}], {}),
    "products": (
        "products",
        [{"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}],
        {},
    ),
    "equations": (
        "simple_equations",
        [
            {
                "min_terms": 2,
                "max_terms": 2,
                "min_value": 1,
                "max_value": 9,
                "operators": ("+",),
                "operators_weights": [1.0],
            }
        ],
        {},
    ),
}
LAST_DIGIT_OF = {"add_last_digit": "add"}  # constructed conflicting convention -> its partner
# candidates without enough base-model signal (benchmarks/studies/tiny_headroom.py, 48 held-out
# tasks, seed 1, 2026-12-01): they need a base model trained on them (`make base-model`) first
NEEDS_RETRAINING: dict[str, str] = {
    "products": "greedy 0.00, pass@8 0.06 (never trained on multiplication)",
    "spell_backward_3": "greedy 0.08, pass@8 0.04 (like tiny/spell_backward)",
    "gcd": "greedy 0.00, pass@8 0.25 (values up to 12; gcd_small, up to 6, is kept)",
}


class LastDigitDomain(TinyDomain):
    """The questions of another tiny domain, answered with the last digit of its integer answer."""

    def generate(self, level: int, rng: Any) -> tuple[str, str, dict[str, Any]]:
        prompt, gold, meta = super().generate(level, rng)
        return prompt, str(abs(int(gold)) % 10), meta

    def score(self, task: Task, answer: str) -> tuple[float, dict[str, Any]]:
        return (1.0 if answer.strip() == task.gold else 0.0), {}


def mix_domains(include_all: bool = False) -> list[Domain]:
    """The registered ``tinymix/*`` domains (all candidates with ``include_all``)."""
    out: list[Domain] = []
    for name, (gen, configs, common) in SPECS.items():
        if include_all or name not in NEEDS_RETRAINING:
            out.append(TinyDomain(gen, f"tinymix/{name}", configs, common))
    for name, partner in LAST_DIGIT_OF.items():
        gen, configs, common = SPECS[partner]
        out.append(LastDigitDomain(gen, f"tinymix/{name}", configs, common))
    return out
