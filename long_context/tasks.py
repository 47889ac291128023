"""Long-context task generators: needle retrieval, multi-hop key-value chains, document synthesis.

Each generator builds a prompt of about ``target_tokens`` tokens from deterministic filler prose
with the facts that matter scattered through it, plus a question, a gold answer and a verifier.

- ``needle``: one "secret code" sentence hidden at a random depth among same-shaped decoys
  (other names); the question asks for one name's code.
- ``kv_chain``: key -> key assignments scattered through the text form a chain of ``hops`` links
  ending at a number; decoy chains of the same shape share the key alphabet. The model must follow
  the chain from the named start key.
- ``doc_synthesis``: shipment records of several depots over several years spread over the
  document; the question asks for one depot's total over all years (an aggregate of facts that are
  never next to each other).

Length: with a tokenizer (any ``count_tokens(text) -> int``) the prompt is measured and the filler
resized until the prompt is within 2% of the target (the number of tokens is recorded in the task).
Without one, ``CHARS_PER_TOKEN = 4`` characters per token is assumed (typical of BPE tokenizers on
English prose); byte-level tokenizers count ~4x more.

Determinism: everything derives from ``random.Random`` seeded with a string of (kind, seed,
length), whose seeding is stable across processes and Python versions.

Curriculum: the scheduler's difficulty levels map to lengths (:data:`LEVEL_TOKENS`, 1k ... 128k);
harder levels of ``kv_chain`` also add hops.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

CHARS_PER_TOKEN = 4.0  # approximate characters per token when no tokenizer is given
LEVEL_TOKENS = [1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072]  # level -> prompt tokens
TokenCounter = Callable[[str], int]

_ADJ = "quiet amber distant hollow silver brisk narrow ancient gentle crooked pale vivid".split()
_NOUN = "river lantern orchard harbor meadow engine ledger tower garden canal bridge mill".split()
_VERB = "passes beside faces shelters outlasts mirrors circles follows crosses guards".split()
_NAMES = "Alder Birch Cedar Dahlia Ember Fennel Garnet Hazel Iris Juniper Kestrel Linden".split()
_DEPOTS = "Northgate Saltmarsh Ironbridge Copperfield Ashford Riverside Elmstead".split()


def level_tokens(level: int) -> int:
    """Target prompt length in tokens for a curriculum level (0 = 1k ... 7 = 128k)."""
    if not 0 <= level < len(LEVEL_TOKENS):
        raise ValueError(f"long-context level must be in [0, {len(LEVEL_TOKENS) - 1}], got {level}")
    return LEVEL_TOKENS[level]


@dataclass
class LongTask:
    """A generated task. ``prompt`` is the full user message; ``gold`` the exact answer."""

    kind: str
    prompt: str
    gold: str
    num_tokens: int  # measured with the tokenizer, or estimated from characters
    meta: dict[str, Any] = field(default_factory=dict)


def _filler_sentence(rng: random.Random) -> str:
    a, n1, v, n2 = rng.choice(_ADJ), rng.choice(_NOUN), rng.choice(_VERB), rng.choice(_NOUN)
    return f"The {a} {n1} {v} the {rng.choice(_ADJ)} {n2}."


def _count(text: str, count_tokens: TokenCounter | None) -> int:
    return count_tokens(text) if count_tokens else round(len(text) / CHARS_PER_TOKEN)


def _assemble(
    rng: random.Random,
    facts: list[str],
    question: str,
    target_tokens: int,
    count_tokens: TokenCounter | None,
) -> tuple[str, int, list[float]]:
    """Scatter ``facts`` through filler so the prompt is ~target_tokens; returns depths too."""
    pool = [_filler_sentence(rng) for _ in range(64)]
    per_sentence = max(1e-3, sum(_count(s + " ", count_tokens) for s in pool) / len(pool))
    slots = sorted(rng.random() for _ in facts)
    head = "Read the document below and answer the question after it.\n\n"
    tail = f"\n\nQuestion: {question}\nAnswer with the answer alone."
    n = max(1, int((target_tokens - _count(head + tail, count_tokens)) / per_sentence) - len(facts))
    text, tokens = "", 0
    for _ in range(4):  # resize the filler until the measured length is within 2%
        pool += [_filler_sentence(rng) for _ in range(n - len(pool))]
        body = pool[:n]
        for fact, depth in zip(facts, slots, strict=True):
            body.insert(int(depth * len(body)), fact)
        text = head + " ".join(body) + tail
        tokens = _count(text, count_tokens)
        if abs(tokens - target_tokens) <= 0.02 * target_tokens:
            break
        n = max(1, round(n + (target_tokens - tokens) / per_sentence))
    return text, tokens, slots


def _rng(kind: str, seed: int, target_tokens: int) -> random.Random:
    return random.Random(f"long_context/{kind}/{seed}/{target_tokens}")


def needle(seed: int, target_tokens: int, count_tokens: TokenCounter | None = None) -> LongTask:
    """One secret code among decoy codes; asks for one name's code."""
    rng = _rng("needle", seed, target_tokens)
    names = rng.sample(_NAMES, 4)
    codes = [str(rng.randrange(1_000_000, 10_000_000)) for _ in names]
    facts = [f"The secret code of {n} is {c}." for n, c in zip(names, codes, strict=True)]
    target = rng.randrange(len(names))
    question = f"What is the secret code of {names[target]}?"
    prompt, tokens, depths = _assemble(rng, facts, question, target_tokens, count_tokens)
    meta = {"name": names[target], "depth": round(depths[target], 3)}
    return LongTask("needle", prompt, codes[target], tokens, meta)


def kv_chain(
    seed: int, target_tokens: int, count_tokens: TokenCounter | None = None, hops: int = 3
) -> LongTask:
    """Follow ``hops`` key -> key links from a start key to a number; decoy chains alongside."""
    rng = _rng(f"kv_chain{hops}", seed, target_tokens)
    keys = [f"K{v:05d}" for v in rng.sample(range(100_000), 4 * (hops + 1))]
    chains = [keys[c * (hops + 1) : (c + 1) * (hops + 1)] for c in range(4)]
    values = [str(rng.randrange(100, 1000)) for _ in chains]
    facts = []
    for chain, value in zip(chains, values, strict=True):
        facts += [f"Key {a} points to key {b}." for a, b in zip(chain, chain[1:], strict=False)]
        facts.append(f"Key {chain[-1]} holds the number {value}.")
    rng.shuffle(facts)
    question = (
        f"Start at key {chains[0][0]} and follow the keys it points to. "
        "Which number does the last key hold?"
    )
    prompt, tokens, _ = _assemble(rng, facts, question, target_tokens, count_tokens)
    return LongTask("kv_chain", prompt, values[0], tokens, {"hops": hops, "start": chains[0][0]})


def doc_synthesis(
    seed: int, target_tokens: int, count_tokens: TokenCounter | None = None
) -> LongTask:
    """Shipment records spread over the document; asks for one depot's total over all years."""
    rng = _rng("doc_synthesis", seed, target_tokens)
    depots = rng.sample(_DEPOTS, 3)
    years = sorted(rng.sample(range(1990, 2030), 3))
    crates = {(d, y): rng.randrange(10, 500) for d in depots for y in years}
    facts = [f"In {y} the {d} depot shipped {n} crates." for (d, y), n in crates.items()]
    rng.shuffle(facts)
    depot = depots[0]
    question = f"How many crates did the {depot} depot ship in total over all the years listed?"
    prompt, tokens, _ = _assemble(rng, facts, question, target_tokens, count_tokens)
    gold = str(sum(n for (d, _), n in crates.items() if d == depot))
    return LongTask("doc_synthesis", prompt, gold, tokens, {"depot": depot, "years": years})


GENERATORS: dict[str, Callable[..., LongTask]] = {
    "needle": needle,
    "kv_chain": kv_chain,
    "doc_synthesis": doc_synthesis,
}


def generate(
    kind: str, seed: int, level: int, count_tokens: TokenCounter | None = None
) -> LongTask:
    """Task of ``kind`` at curriculum ``level`` (length from :func:`level_tokens`)."""
    if kind not in GENERATORS:
        raise ValueError(
            f"unknown long-context task kind {kind!r}; choose one of {list(GENERATORS)}"
        )
    target = level_tokens(level)
    if kind == "kv_chain":
        return kv_chain(seed, target, count_tokens, hops=2 + level // 2)
    return GENERATORS[kind](seed, target, count_tokens)


_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def extract_answer(response: str) -> str:
    """Content of ``<answer>...</answer>`` if present, else the first non-empty line."""
    m = _ANSWER.search(response)
    if m:
        return m.group(1).strip()
    for line in response.splitlines():
        if line.strip():
            return line.strip()
    return ""


def normalize(answer: str) -> str:
    """Canonical form of an extracted answer: stripped, trailing period and digit commas gone."""
    return answer[:200].strip().rstrip(".").replace(",", "").strip()


def verify(gold: str, response: str) -> tuple[float, bool]:
    """(score, parsable): 1.0 when the extracted answer equals ``gold`` (digits compared as
    numbers, trailing punctuation ignored). Never raises on model output."""
    try:
        answer = normalize(extract_answer(str(response)))
    except Exception:  # model output must never crash scoring
        return 0.0, False
    if not answer:
        return 0.0, False
    return (1.0 if answer == gold else 0.0), True
