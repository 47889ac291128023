"""Difficulty ladders for the many-domain scheduler study (``ladder/<generator>_<rung>``).

Each ladder is one reasoning-gym generator at a series of settings, easiest first, and every
rung is a domain of its own with one level, so a run over all of them trains ~250 domains at
once (issue 40, docs/scheduler.md "Hundreds of domains"). The rungs move one knob at a time
(one more term, one more digit, a wider range, a longer word), so that an easier rung learned
can bring the next one within reach: the frontier is meant to move during training.

The ladders are built on generators whose prompts the tiny bases were trained to read
(``chain_sum``, ``basic_arithmetic``, ``spell_backward``, ``letter_counting``, ``count_bits``)
and on others they never saw (``gcd``, ``lcm``, ``products``, ``simple_equations``,
``leg_counting``, ``count_primes``, ``base_conversion``,
``fraction_simplification``, ``decimal_chain_sum``, ``number_format``,
``word_sequence_reversal``), most of which are out of
reach for a ~1M-parameter model, as most of a lab's mix is out of reach for its current policy.
Which rung is which is measured, not assumed: ``benchmarks/studies/many_screen.py`` screens every
rung on the base model and registers it as frontier, out of reach or saturated.

Rungs whose prompt space is too small for a held-out set of a few dozen prompts (one in four
prompts is held out by hash) are left out of the ladders: e.g. two 1-digit terms (100 prompts).
"""

from __future__ import annotations

from typing import Any

from domains.tiny_domain import TinyDomain
from megatron_rl.domains.base import Domain

ADD = {"operators": ("+",), "allow_parentheses": False, "allow_negation": False}
PLUS_MINUS = {"operators": ("+", "-"), "allow_parentheses": False, "allow_negation": False}
Rungs = list[tuple[str, dict[str, Any]]]


def _terms(pairs: list[tuple[int, int, int]]) -> Rungs:
    """Rungs of (terms, min digits, max digits)."""
    out: Rungs = []
    for t, lo, hi in pairs:
        digits = f"d{lo}" if lo == hi else f"d{lo}to{hi}"
        out.append(
            (f"t{t}_{digits}", {"min_terms": t, "max_terms": t, "min_digits": lo, "max_digits": hi})
        )
    return out


def _exact(key_min: str, key_max: str, values: list[int], label: str) -> Rungs:
    return [(f"{label}{v}", {key_min: v, key_max: v}) for v in values]


def _range(key: str, values: list[int], label: str, **fixed: Any) -> Rungs:
    return [(f"{label}{v}", {**fixed, key: v}) for v in values]


ARITH_TERMS = [(2, 1, 2), (2, 2, 2), (3, 1, 1), (3, 1, 2), (4, 1, 1), (2, 1, 3), (5, 1, 1)]
CHAIN_TERMS = [*ARITH_TERMS, (4, 1, 2), (3, 2, 2), (6, 1, 1), (2, 3, 3), (8, 1, 1), (10, 1, 1)]
GCD_MAX = [25, 30, 40, 50, 75, 100, 150, 200, 300, 1000, 10000, 100000]
LCM_MAX = [
    25,
    30,
    35,
    40,
    45,
    50,
    60,
    75,
    90,
    100,
    150,
    200,
    300,
    500,
    1000,
    3000,
    10000,
    30000,
    100000,
]
PRIMES_MAX = [40, 50, 75, 100, 150, 200, 300, 500, 1000, 3000, 5000, 10000]
BITS = [9, 10, 11, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 32, 36, 40, 44, 48]
EQ_MIXED = [(2, 10), (2, 30), (2, 100), (3, 10), (3, 30), (3, 100), (4, 30), (4, 100)]
BASES = [
    (2, 4, 100),
    (2, 4, 300),
    (2, 8, 100),
    (2, 10, 100),
    (2, 10, 300),
    (2, 16, 300),
    (2, 16, 1000),
    (2, 16, 10000),
    (2, 16, 100000),
    (3, 7, 1000),
    (8, 16, 10000),
    (2, 16, 1000000),
]
FORMATS = [
    (2, 99, 5.0),
    (2, 999, 5.0),
    (3, 99, 5.0),
    (3, 999, 5.0),
    (4, 999, 5.0),
    (5, 999, 5.0),
    (3, 99999, 10.0),
    (5, 99999, 10.0),
    (2, 99999, 10.0),
    (4, 99999, 10.0),
    (5, 9999999, 10.0),
    (2, 9999999, 10.0),
    (3, 9999999, 10.0),
    (4, 9999999, 10.0),
]
POWERS = [
    (3, 1),
    (3, 2),
    (5, 2),
    (10, 2),
    (10, 3),
    (20, 3),
    (50, 3),
    (100, 4),
]  # (|base| max, exponent max)
DECIMALS = [
    (2, 1),
    (2, 2),
    (3, 1),
    (3, 2),
    (4, 1),
    (4, 2),
    (5, 1),
    (5, 2),
]  # (terms, decimal places)
ONE = {"min_numbers": 2, "max_numbers": 2}

# ladder name -> (generator, settings all rungs share, rungs easiest first)
LADDERS: dict[str, tuple[str, dict[str, Any], Rungs]] = {
    "chain_sum": ("chain_sum", {}, _terms(CHAIN_TERMS)),
    "add": ("basic_arithmetic", ADD, _terms(ARITH_TERMS)),
    "plus_minus": ("basic_arithmetic", PLUS_MINUS, _terms(ARITH_TERMS)),
    "spell_backward": (
        "spell_backward",
        {},
        _exact("min_word_len", "max_word_len", list(range(3, 11)), "len"),
    ),
    "letter_counting": (
        "letter_counting",
        {},
        _exact("min_words", "max_words", list(range(1, 13)), "words"),
    ),
    "count_bits": ("count_bits", {"min_n": 1}, [(f"bits{k}", {"max_n": 2**k - 1}) for k in BITS]),
    "gcd": ("gcd", {**ONE, "min_value": 1}, _range("max_value", GCD_MAX, "max")),
    "lcm": ("lcm", {**ONE, "min_value": 1}, _range("max_value", LCM_MAX, "max")),
    "products": (
        "products",
        {"allow_negation": False},
        _terms(
            [
                (2, 1, 2),
                (2, 2, 2),
                (3, 1, 1),
                (2, 1, 3),
                (3, 1, 2),
                (4, 1, 1),
                (2, 3, 3),
                (3, 2, 2),
                (4, 1, 2),
                (2, 2, 4),
                (3, 2, 3),
            ]
        ),
    ),
    "equations_add": (
        "simple_equations",
        {
            "min_terms": 2,
            "max_terms": 2,
            "min_value": 1,
            "operators": ("+",),
            "operators_weights": [1.0],
        },
        _range("max_value", [10, 15, 20, 30, 50, 100, 200, 1000], "max"),
    ),
    "equations_mixed": (
        "simple_equations",
        {
            "min_terms": 2,
            "min_value": 1,
            "operators": ("+", "-", "*"),
            "operators_weights": [0.4, 0.4, 0.2],
        },
        [(f"t{t}_max{v}", {"max_terms": t, "max_value": v}) for t, v in EQ_MIXED],
    ),
    "leg_counting": (
        "leg_counting",
        {"min_instances": 1, "max_instances": 3},
        _exact("min_animals", "max_animals", list(range(2, 17)), "animals"),
    ),
    "leg_counting_one": (
        "leg_counting",
        {"min_instances": 1, "max_instances": 1},
        _exact("min_animals", "max_animals", list(range(2, 12)), "animals"),
    ),
    "count_primes": ("count_primes", {"min_n": 1}, _range("max_n", PRIMES_MAX, "max")),
    "base_conversion": (
        "base_conversion",
        {"min_value": 1},
        [
            (f"b{lo}to{hi}_max{v}", {"min_base": lo, "max_base": hi, "max_value": v})
            for lo, hi, v in BASES
        ],
    ),
    "fraction_simplification": (
        "fraction_simplification",
        {"min_value": 1, "styles": ("plain",)},
        [
            (f"max{v}_f{f}", {"max_value": v, "max_factor": f})
            for v, f in [
                (20, 5),
                (20, 10),
                (50, 10),
                (100, 20),
                (1000, 100),
                (10000, 100),
                (10000, 1000),
            ]
        ],
    ),
    "decimal_chain_sum": (
        "decimal_chain_sum",
        {"min_digits": 1, "max_digits": 1, "min_decimal_places": 1, "allow_negation": False},
        [
            (f"t{t}_dp{dp}", {"min_terms": t, "max_terms": t, "max_decimal_places": dp})
            for t, dp in [(2, 1), (2, 2), (3, 1), (3, 2), (4, 1)]
        ],
    ),
    "number_format": (
        "number_format",
        {"min_n": 10},
        [
            (
                f"c{c}_max{n}_d{d:g}",
                {"min_num_candidates": c, "max_num_candidates": c, "max_n": n, "max_delta": d},
            )
            for c, n, d in FORMATS
        ],
    ),
    "word_reversal": ("word_sequence_reversal", {}, _exact("min_words", "max_words", [2], "words")),
    "power_function": (
        "power_function",
        {"min_exponent": 0},
        [
            (f"base{b}_exp{e}", {"min_base": -float(b), "max_base": float(b), "max_exponent": e})
            for b, e in POWERS
        ],
    ),
    "decimal_arithmetic": (
        "decimal_arithmetic",
        {"min_num_decimal_places": 1, "precision": 6},
        [
            (f"t{t}_dp{dp}", {"min_terms": t, "max_terms": t, "max_num_decimal_places": dp})
            for t, dp in DECIMALS
        ],
    ),
    "bitwise_arithmetic": (
        "bitwise_arithmetic",
        {},
        [(f"level{k}", {"difficulty": k}) for k in (1, 2, 3)],
    ),
    "complex_arithmetic": (
        "complex_arithmetic",
        {},
        [
            (
                f"max{m}_{name}",
                {
                    "min_real": -m,
                    "max_real": m,
                    "min_imag": -m,
                    "max_imag": m,
                    "operations": ops,
                    "operations_weights": [1.0 / len(ops)] * len(ops),
                },
            )
            for m in (3, 10)
            for name, ops in (("add", ("+", "-")), ("mul", ("*",)))
        ],
    ),
    "number_sorting": (
        "number_sorting",
        {"min_decimals": 0, "max_decimals": 0, "min_value": 0.0},
        [
            (f"n{n}_max{v}", {"min_numbers": n, "max_numbers": n, "max_value": float(v)})
            for n, v in [(2, 99), (3, 99), (2, 999), (2, 9999)]
        ],
    ),
    "word_sorting": (
        "word_sorting",
        {"min_word_length": 3, "max_word_length": 5},
        _exact("min_words", "max_words", [2, 3], "words"),
    ),
    "letter_jumble": (
        "letter_jumble",
        {"min_words": 1, "max_words": 1, "min_corruption_level": 0.3, "max_corruption_level": 0.6},
        _exact("min_word_len", "max_word_len", [4, 5, 6, 7, 8, 9, 10], "len"),
    ),
    "rotate_matrix": (
        "rotate_matrix",
        {"min_n": 2, "max_n": 2},
        [(f"rot{r}", {"min_rotations": r, "max_rotations": r}) for r in (1, 2, 3)],
    ),
}


def ladder_domains() -> list[Domain]:
    """One single-level domain per rung, tagged with its ladder (the radar's and heatmap's
    family) and its generator."""
    out: list[Domain] = []
    for ladder, (gen, shared, rungs) in LADDERS.items():
        for rung, cfg in rungs:
            d = TinyDomain(gen, f"ladder/{ladder}_{rung}", [cfg], shared)
            d.tags = (ladder, "ladder", gen)
            out.append(d)
    return out


def ladder_of(name: str) -> str:
    """The ladder a ``ladder/*`` domain belongs to (the longest ladder name that prefixes it)."""
    rest = name.split("/", 1)[1]
    return max((k for k in LADDERS if rest.startswith(k + "_")), key=len)
