"""Domains of the real-training scheduler benchmark (``tinysched/<name>``, docs/scheduler.md).

Every (domain, level) here has a prompt space of at least 1,000 distinct prompts (so the
held-out split has hundreds of distinct prompts and the training split cannot be memorised in a
short run), and the set spans three learnability classes, measured on the shipped base model
(``models/tiny-base``) by pass@k at T = 1 (``benchmarks/studies/scheduler_domains.py``, which also
estimates each prompt space):

* frontier: the base model solves a task sometimes (pass@8 0.3-0.8): GRPO groups carry signal;
* saturated: it solves most tasks (pass@1 >= 0.8) and most 8-sample groups are all-pass;
* near-impossible: pass@8 <= 0.07: almost every group is all-fail.

A mix can only matter where domains differ in how much a group teaches; this set makes that
difference large on purpose, and the benchmark says so.

The constructed seesaw pair (``PAIR``)
    ``tinysched/gcd`` and ``tinysched/gcd_plus_100`` ask the *same* questions (the GCD of two
    numbers up to 100) and differ only in the answer convention: the GCD, or the GCD plus 100.
    The conventions disagree on every item, the prompt cannot tell them apart, and their answer
    sets are disjoint (1-100 against 101-200), so no answer pays under both: moving answer mass
    onto one convention takes it from the other. The shipped base model knows neither, so the
    pair starts from ``models/tiny-seesaw-base``, a short SFT of it on a 50/50 mix of the two
    (``configs/seesaw_base_sft.yaml``), where both have reward signal. It is labelled as
    constructed: real domains rarely conflict this cleanly. Two earlier pairs were dropped on
    development seed 1 (docs/scheduler.md): the letter count vs the count minus one, and the
    GCD vs the GCD plus one (``tinysched/gcd_plus_one``, still registered). In both, training
    one convention alone raised the other too, because the answers RL moves mass onto (a
    well-formed count; "2", which is also the GCD plus one whenever the GCD is 1) pay under
    both conventions.
"""

from __future__ import annotations

from typing import Any

from domains.tiny_domain import TinyDomain
from megatron_rl.domains.base import Domain, Task

PLUS_MINUS = {"operators": ("+", "-"), "allow_parentheses": False, "allow_negation": False}
TWO_TERMS = {"min_terms": 2, "max_terms": 2}
# name -> (reasoning-gym generator, level-0 config, learnability class on the shipped base model)
SPECS: dict[str, tuple[str, dict[str, Any], str]] = {
    "chain_sum_2digit": (
        "chain_sum",
        {**TWO_TERMS, "min_digits": 1, "max_digits": 2},
        "frontier",
    ),
    "gcd_100": (
        "gcd",
        {"min_numbers": 2, "max_numbers": 2, "min_value": 1, "max_value": 100},
        "frontier",
    ),
    "letters_3to5": ("letter_counting", {"min_words": 3, "max_words": 5}, "frontier"),
    "letters_1word": ("letter_counting", {"min_words": 1, "max_words": 1}, "saturated"),
    "letters_1to2": ("letter_counting", {"min_words": 1, "max_words": 2}, "saturated"),
    "products_2digit": (
        "products",
        {**TWO_TERMS, "min_digits": 1, "max_digits": 2},
        "impossible",
    ),
    "spell_backward_4": (
        "spell_backward",
        {"min_word_len": 3, "max_word_len": 4},
        "impossible",
    ),
    "arith_2digit": (
        "basic_arithmetic",
        {**TWO_TERMS, "min_digits": 2, "max_digits": 2, **PLUS_MINUS},
        "impossible",
    ),
    # four more near-impossible domains for the second domain set (D2, docs/scheduler.md)
    "equations_50": (
        "simple_equations",
        {
            "min_terms": 2,
            "max_terms": 2,
            "min_value": 1,
            "max_value": 50,
            "operators": ("+",),
            "operators_weights": [1.0],
        },
        "impossible",
    ),
    "lcm_50": (
        "lcm",
        {"min_numbers": 2, "max_numbers": 2, "min_value": 1, "max_value": 50},
        "impossible",
    ),
    "spell_backward_6": (
        "spell_backward",
        {"min_word_len": 5, "max_word_len": 6},
        "impossible",
    ),
    "chain_sum_3terms_2digit": (
        "chain_sum",
        {"min_terms": 3, "max_terms": 3, "min_digits": 1, "max_digits": 2},
        "impossible",
    ),
}
PAIR = ("tinysched/gcd", "tinysched/gcd_plus_100")  # (A, B) of the seesaw experiment
OFFSETS = {"tinysched/gcd_plus_one": 1, "tinysched/gcd_plus_100": 100}  # B conventions
PAIR_CONFIG = {"min_numbers": 2, "max_numbers": 2, "min_value": 1, "max_value": 100}


def split_config(cfg: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(level config, settings every level shares): basic_arithmetic's operator keys are shared."""
    shared = {k: v for k, v in cfg.items() if k in PLUS_MINUS}
    return {k: v for k, v in cfg.items() if k not in shared}, shared


class OffsetDomain(TinyDomain):
    """The questions of another tiny domain, answered with its integer answer plus ``offset``."""

    def __init__(self, *args: Any, offset: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.offset = offset

    def generate(self, level: int, rng: Any) -> tuple[str, str, dict[str, Any]]:
        prompt, gold, meta = super().generate(level, rng)
        return prompt, str(int(gold) + self.offset), meta

    def score(self, task: Task, answer: str) -> tuple[float, dict[str, Any]]:
        return (1.0 if answer.strip() == task.gold else 0.0), {}


def sched_domains() -> list[Domain]:
    """The benchmark set (``SPECS``), the GCD and its offset conventions, all single-level."""
    out: list[Domain] = []
    for name, (gen, cfg, _) in SPECS.items():
        level, shared = split_config(cfg)
        out.append(TinyDomain(gen, f"tinysched/{name}", [level], shared))
    out.append(TinyDomain("gcd", PAIR[0], [PAIR_CONFIG], {}))
    for name, offset in OFFSETS.items():
        out.append(OffsetDomain("gcd", name, [PAIR_CONFIG], {}, offset=offset))
    return out
