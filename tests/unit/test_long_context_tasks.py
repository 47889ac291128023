"""Long-context task generators (long_context/tasks.py): lengths, determinism, gold answers."""

from __future__ import annotations

import re

import pytest

from long_context.tasks import (
    CHARS_PER_TOKEN,
    GENERATORS,
    LEVEL_TOKENS,
    doc_synthesis,
    generate,
    kv_chain,
    level_tokens,
    needle,
    verify,
)
from megatron_rl.model.tokenizer import build_tokenizer


def solve_needle(prompt: str, name: str) -> str:
    return re.findall(rf"The secret code of {name} is (\d+)\.", prompt)[0]


def solve_kv(prompt: str, start: str) -> str:
    links = dict(re.findall(r"Key (K\d+) points to key (K\d+)\.", prompt))
    values = dict(re.findall(r"Key (K\d+) holds the number (\d+)\.", prompt))
    key = start
    while key in links:
        key = links[key]
    return values[key]


def solve_depot(prompt: str, depot: str) -> str:
    return str(sum(int(n) for n in re.findall(rf"the {depot} depot shipped (\d+) crates", prompt)))


@pytest.mark.parametrize("seed", range(5))
def test_gold_answers_are_what_the_document_says(seed: int) -> None:
    t = needle(seed, 2048)
    assert solve_needle(t.prompt, t.meta["name"]) == t.gold
    t = kv_chain(seed, 2048, hops=4)
    assert solve_kv(t.prompt, t.meta["start"]) == t.gold
    assert len(re.findall(r"Key K\d+ points to", t.prompt)) == 4 * 4  # 4 chains of 4 links
    t = doc_synthesis(seed, 2048)
    assert solve_depot(t.prompt, t.meta["depot"]) == t.gold


@pytest.mark.parametrize("kind", list(GENERATORS))
@pytest.mark.parametrize("level", range(len(LEVEL_TOKENS)))
def test_lengths_1k_to_128k_by_level(kind: str, level: int) -> None:
    t = generate(kind, seed=7, level=level)
    target = LEVEL_TOKENS[level]
    assert abs(t.num_tokens - target) <= 0.02 * target
    assert abs(len(t.prompt) / CHARS_PER_TOKEN - target) <= 0.02 * target + 1


@pytest.mark.parametrize("kind", list(GENERATORS))
def test_length_counted_with_a_real_tokenizer(kind: str) -> None:
    tok = build_tokenizer()  # the project's byte-level tokenizer (~1 token per character)

    def count(text: str) -> int:
        return len(tok(text, add_special_tokens=False)["input_ids"])

    t = generate(kind, seed=1, level=2, count_tokens=count)
    assert count(t.prompt) == t.num_tokens
    assert abs(t.num_tokens - 4096) <= 0.02 * 4096


@pytest.mark.parametrize("kind", list(GENERATORS))
def test_deterministic_per_seed_and_different_across_seeds(kind: str) -> None:
    a, b, c = generate(kind, 3, 1), generate(kind, 3, 1), generate(kind, 4, 1)
    assert (a.prompt, a.gold) == (b.prompt, b.gold)
    assert a.prompt != c.prompt


def test_curriculum_levels() -> None:
    assert [level_tokens(i) for i in range(8)] == [2**k * 1024 for k in range(8)]
    assert generate("kv_chain", 0, 0).meta["hops"] < generate("kv_chain", 0, 7).meta["hops"]
    with pytest.raises(ValueError, match="level must be in"):
        level_tokens(8)
    with pytest.raises(ValueError, match="choose one of"):
        generate("haystack", 0, 0)


@pytest.mark.parametrize(
    "response, expected",
    [
        ("4417", (1.0, True)),
        ("<answer> 4,417 </answer>", (1.0, True)),
        ("4417.\nbecause...", (1.0, True)),
        ("4418", (0.0, True)),
        ("", (0.0, False)),
        ("\x00\ufffd" * 1000, (0.0, True)),
        ("x" * 1_000_000, (0.0, True)),
    ],
)
def test_verifier_values(response: str, expected: tuple[float, bool]) -> None:
    assert verify("4417", response) == expected
