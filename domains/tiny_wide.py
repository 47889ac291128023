"""Tiny-model domains with room to generalise (``tinywide/<name>``).

The ``tiny/*`` level-0 spaces are small enough to memorise (count_bits 63 prompts, chain_sum
~200; ``megatron-rl domains check``), so a held-out gain there mostly measures recall of prompts
the base model saw in SFT. These are the same reasoning-gym generators at wider settings (more
digits, more terms, longer numbers, more words, longer words), one level each, with at least a
few hundred prompts in the eval split (``domains check`` estimates of 2026-12-01: letter_counting
~3.8e4, arith3 ~4.7e3, count_bits ~1.9e3, chain_sum ~1.6e3, add ~530; spell_backward draws from
~1.7e4 words of 3-5 letters and spell_backward_long from ~4.1e4 of 6-7). The CPU demo trains on
``spell_backward``, ``spell_backward_long``, ``count_bits`` and ``chain_sum`` from
``models/tiny-demo-base`` (``configs/demo_base_sft.yaml``, which adds the spelling domains to the
shipped base); ``configs/base_sft_wide.yaml`` is a continued SFT on the first five that was
tried as a demo base and dropped (docs/LOG.md).
"""

from __future__ import annotations

from typing import Any

from domains.tiny_domain import TinyDomain
from megatron_rl.domains.base import Domain

ADD_ONLY = {"operators": ("+",), "allow_parentheses": False, "allow_negation": False}
PLUS_MINUS = {"operators": ("+", "-"), "allow_parentheses": False, "allow_negation": False}

# name -> (generator, its one level's config, settings shared by all levels)
SPECS: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {
    # "a + b" with 1-2 digit terms
    "add": (
        "basic_arithmetic",
        {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2},
        ADD_ONLY,
    ),
    # three 1-digit terms with + and -
    "arith3": (
        "basic_arithmetic",
        {"min_terms": 3, "max_terms": 3, "min_digits": 1, "max_digits": 1},
        PLUS_MINUS,
    ),
    # chain sums of 2 terms of 1-2 digits (the tiny/chain_sum level 1 setting)
    "chain_sum": (
        "chain_sum",
        {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2},
        {},
    ),
    # set bits of a number below 2048 (11 bits)
    "count_bits": ("count_bits", {"min_n": 1, "max_n": 2047}, {}),
    # one letter counted over 3-4 words
    "letter_counting": ("letter_counting", {"min_words": 3, "max_words": 4}, {}),
    # one word of 3-5 letters spelled backward (answers as spread as the words)
    "spell_backward": ("spell_backward", {"min_word_len": 3, "max_word_len": 5}, {}),
    # one word of 6-7 letters spelled backward
    "spell_backward_long": ("spell_backward", {"min_word_len": 6, "max_word_len": 7}, {}),
}


def wide_domains() -> list[Domain]:
    """The ``tinywide/*`` domains (registered through the ``tiny`` entry point)."""
    return [
        TinyDomain(gen, f"tinywide/{name}", [cfg], common)
        for name, (gen, cfg, common) in SPECS.items()
    ]
