"""Retrieval task family sized for the tiny byte-level policy: exact lengths, exact answers.

Three kinds, each a document of filler prose with a few records scattered through it at random
depths, and one question at the end that only the records answer. The answer is the record
itself, quoted exactly (so a model copies it from where it sits in the context):

- ``kv_lookup``: records ``The code of <Name> is <dddd>.`` for several names; asks for one
  name's code; answer ``The code of Ritiv is 5085.``
- ``multi_needle``: the same records; asks for two names' codes; answer both records, in the
  asked order, separated by one space.
- ``which_line``: the document is lines of prose, a few of which have a name as their subject;
  asks which line mentions one of the names; answer that line (``Ritiv mirrors the pale mill.``).

Names are five letters built from consonant-vowel patterns (14 * 5 * 14 * 5 * 14 = 68,600 names)
and are never filler words; codes are four digits; filler sentences are drawn from a small
grammar. The prompt space of every level is therefore astronomically large: every prompt of an
eval set is a new one (the held-out split is still decided by the prompt hash, see
``megatron_rl/domains/base.py``). A policy that knows the answer format but not where the record
is gets the four digits right by chance once in 9,000 (``kv_lookup``).

Lengths: a level's prompt is exactly :data:`LEVEL_CHARS` characters (ASCII), which is exactly
that many tokens for a byte-level tokenizer such as the shipped tiny model's (the chat template
adds its own few tokens); a BPE tokenizer counts roughly four times fewer. Equal lengths inside a
level let an engine prefill a batch of prompts without padding. Levels run from 256 to 32k:
the number of records and their shape are the same at every level, so a length curriculum over
these levels isolates what context length costs a policy.

Answers are compared exactly (after stripping surrounding whitespace): no partial credit.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

LEVEL_CHARS = [256, 512, 1024, 2048, 4096, 8192, 16384, 32768]  # level -> prompt characters
N_RECORDS = 4  # records (one asked, the others decoys) in every document of the domains

_ADJ = "quiet amber distant hollow silver brisk narrow ancient gentle crooked pale vivid".split()
_NOUN = "river lantern orchard harbor meadow engine ledger tower garden canal bridge mill".split()
_VERB = "passes reaches faces shelters outlasts mirrors circles follows crosses guards".split()
_CONS = "bdfgklmnprstvz"
_VOWELS = "aeiou"
_PAD_WORDS = ["a", "an", "so", "and", "the", "then", "also", "again"]  # fill an exact length


@dataclass(frozen=True)
class RetrievalTask:
    """One generated task: the user message, the exact answer, and where the facts sit."""

    kind: str
    prompt: str
    gold: str
    depths: tuple[float, ...]  # relative position in the document of each asked fact (0..1)


def level_chars(level: int) -> int:
    """Prompt length in characters (= byte-level tokens) of a curriculum level."""
    if not 0 <= level < len(LEVEL_CHARS):
        raise ValueError(f"retrieval level must be in [0, {len(LEVEL_CHARS) - 1}], got {level}")
    return LEVEL_CHARS[level]


def make_name(rng: random.Random) -> str:
    """A capitalised five-letter name (consonant-vowel-consonant-vowel-consonant)."""
    c, v = _CONS, _VOWELS
    return (rng.choice(c) + rng.choice(v) + rng.choice(c) + rng.choice(v) + rng.choice(c)).title()


def _names(rng: random.Random, n: int) -> list[str]:
    names: list[str] = []
    while len(names) < n:
        name = make_name(rng)
        if name not in names:
            names.append(name)
    return names


def _code(rng: random.Random) -> str:
    return str(rng.randrange(1000, 10000))


def filler_sentence(rng: random.Random) -> str:
    a, n1, v, n2 = rng.choice(_ADJ), rng.choice(_NOUN), rng.choice(_VERB), rng.choice(_NOUN)
    return f"The {a} {n1} {v} the {rng.choice(_ADJ)} {n2}."


def pad_text(rng: random.Random, n: int) -> str:
    """Exactly ``n`` characters of lower-case filler words (spaces where no word fits)."""
    words: list[str] = []
    used = 0
    while True:
        room = n - used - (1 if words else 0)
        fits = [w for w in _PAD_WORDS if len(w) <= room]
        if not fits:
            break
        w = rng.choice(fits)
        used += len(w) + (1 if words else 0)
        words.append(w)
    return " ".join(words) + " " * (n - used)


def _prose(rng: random.Random, facts: list[str], budget: int) -> tuple[str, list[float]]:
    """Filler sentences with ``facts`` inserted at random depths, exactly ``budget`` characters.

    Returns the text and each fact's relative depth (index among the sentences / count).
    """
    fixed = sum(len(f) + 1 for f in facts)
    if fixed - 1 > budget:
        raise ValueError(f"retrieval: {budget} characters cannot hold the records ({fixed - 1})")
    sentences: list[str] = []
    used = fixed
    while True:
        s = filler_sentence(rng)
        if used + len(s) + 1 > budget:
            break
        sentences.append(s)
        used += len(s) + 1
    slots = sorted(rng.randrange(len(sentences) + 1) for _ in facts)
    order = list(range(len(facts)))
    rng.shuffle(order)
    for k, (slot, f) in enumerate(zip(slots, order, strict=True)):
        sentences.insert(slot + k, facts[f])
    total = len(sentences)
    depths = [0.0] * len(facts)
    for pos, s in enumerate(sentences):
        if s in facts:
            depths[facts.index(s)] = pos / max(1, total - 1)
    body = " ".join(sentences)
    rest = budget - len(body)
    if rest > 1:
        body += " " + pad_text(rng, rest - 1)
    elif rest == 1:
        body += " "
    assert len(body) == budget, (len(body), budget)
    return body, depths


def _records(rng: random.Random, n: int) -> tuple[list[str], list[str], list[str]]:
    names = _names(rng, n)
    codes = [_code(rng) for _ in names]
    facts = [f"The code of {n} is {c}." for n, c in zip(names, codes, strict=True)]
    return names, codes, facts


def kv_lookup(rng: random.Random, chars: int, records: int = N_RECORDS) -> RetrievalTask:
    """Records ``The code of <Name> is <dddd>.`` in prose; asks for the first name's code."""
    names, _, facts = _records(rng, records)
    question = f"\nQuestion: What is the code of {names[0]}? Quote its record."
    body, depths = _prose(rng, facts, chars - len(question))
    return RetrievalTask("kv_lookup", body + question, facts[0], (depths[0],))


def multi_needle(rng: random.Random, chars: int, records: int = N_RECORDS) -> RetrievalTask:
    """The same records; asks for two names' codes: both records, in order, space-separated."""
    names, _, facts = _records(rng, max(2, records))
    question = f"\nQuestion: What are the codes of {names[0]} and {names[1]}? Quote the records."
    body, depths = _prose(rng, facts, chars - len(question))
    return RetrievalTask(
        "multi_needle", body + question, f"{facts[0]} {facts[1]}", tuple(depths[:2])
    )


def _line(rng: random.Random, name: str | None = None) -> str:
    """``The quiet river passes the amber mill.``; a named line has the name as its subject."""
    subject = name or f"The {rng.choice(_ADJ)} {rng.choice(_NOUN)}"
    return f"{subject} {rng.choice(_VERB)} the {rng.choice(_ADJ)} {rng.choice(_NOUN)}."


def which_line(rng: random.Random, chars: int, records: int = N_RECORDS) -> RetrievalTask:
    """Lines of prose; ``records`` of them have a name as subject; asks for one name's line."""
    names = _names(rng, records)
    question = f"\nQuestion: Which line mentions {names[0]}? Quote the line."
    budget = chars - len(question)
    lines: list[str] = []
    used = -1  # no newline before the first line
    while used + 1 + len(line := _line(rng)) <= budget:
        lines.append(line)
        used += 1 + len(line)
    if len(lines) < records:
        raise ValueError(f"which_line: {chars} characters hold fewer than {records} lines")
    picks = rng.sample(range(len(lines)), records)
    for index, name in zip(picks, names, strict=True):
        lines[index] = _line(rng, name)  # a name is shorter than "The <adj> <noun>"
    used = len("\n".join(lines))
    while used + 1 + len(line := _line(rng)) <= budget:  # refill what the names freed
        lines.append(line)
        used += 1 + len(line)
    body = "\n".join(lines)
    rest = budget - len(body)
    if rest > 0:
        body += "\n" + pad_text(rng, rest - 1)
    assert len(body) == budget, (len(body), budget)
    depth = picks[0] / max(1, len(lines) - 1)
    return RetrievalTask("which_line", body + question, lines[picks[0]], (depth,))


def digit_needle(rng: random.Random, chars: int, records: int = 1) -> RetrievalTask:
    """One record ``The secret digit is <d>.`` in prose (the document's only digit); asks for the
    digit; answer the digit alone. ``records`` is accepted for the generators' common signature
    and must be 1: the kind has no decoys (the needle is found by what it is, not by a key)."""
    if records != 1:
        raise ValueError(f"digit_needle has exactly one record (no decoys), got records={records}")
    digit = str(rng.randrange(10))
    fact = f"The secret digit is {digit}."
    question = "\nQuestion: What is the secret digit? Answer with the digit."
    body, depths = _prose(rng, [fact], chars - len(question))
    return RetrievalTask("digit_needle", body + question, digit, (depths[0],))


GENERATORS: dict[str, Callable[..., RetrievalTask]] = {  # (rng, chars, records=N_RECORDS)
    "digit_needle": digit_needle,
    "kv_lookup": kv_lookup,
    "multi_needle": multi_needle,
    "which_line": which_line,
}


def generate(kind: str, level: int, rng: random.Random) -> RetrievalTask:
    """A task of ``kind`` at curriculum ``level``, drawn from ``rng`` alone."""
    if kind not in GENERATORS:
        raise ValueError(f"unknown retrieval kind {kind!r}; choose one of {list(GENERATORS)}")
    return GENERATORS[kind](rng, level_chars(level))


def normalize(answer: str) -> str:
    """Strip surrounding whitespace; nothing else (the comparison is exact)."""
    return answer.strip()
