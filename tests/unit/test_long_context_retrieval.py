"""The retrieval family (long_context/retrieval.py, domains long_context/{kv_lookup,multi_needle,
which_line}): exact lengths per level, gold answers read back from the documents, exact scoring,
the domain contract at every level, and prompt spaces with room for distinct held-out sets."""

from __future__ import annotations

import random
import re

import pytest

from domains.long_context import domains
from long_context.retrieval import GENERATORS, LEVEL_CHARS, generate, level_chars, pad_text
from megatron_rl.domains.contract import check_domain
from megatron_rl.domains.registry import registry
from megatron_rl.evaluation.prompt_sets import build_prompt_set
from megatron_rl.model.tokenizer import build_tokenizer, prompt_ids

KINDS = sorted(GENERATORS)
NAME = r"\b([BDFGKLMNPRSTVZ][aeiou][bdfgklmnprstvz][aeiou][bdfgklmnprstvz])\b"
FAMILY = {d.name: d for d in domains() if d.name.split("/")[1] in GENERATORS}


def read_back(kind: str, prompt: str) -> str:
    """The answer as a reader finds it in the document (independent of the generator)."""
    doc, question = prompt.rsplit("\nQuestion: ", 1)
    names = re.findall(NAME, question)
    if kind == "digit_needle":
        (digit,) = re.findall(r"\d", doc)  # the document's only digit
        assert re.search(rf"The secret digit is {digit}\.", doc)
        return digit
    if kind == "which_line":
        (line,) = [x for x in doc.split("\n") if x.startswith(names[0] + " ")]
        return line
    records = [re.search(rf"The code of {n} is \d{{4}}\.", doc) for n in names]
    assert all(records), (names, doc[:200])
    return " ".join(r.group(0) for r in records if r)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("level", range(len(LEVEL_CHARS)))
def test_exact_length_and_gold_from_the_document(kind: str, level: int) -> None:
    for seed in range(3):
        t = generate(kind, level, random.Random(seed))
        assert len(t.prompt) == LEVEL_CHARS[level] and t.prompt.isascii()
        assert read_back(kind, t.prompt) == t.gold
        assert all(0.0 <= d <= 1.0 for d in t.depths)


def test_byte_level_tokens_equal_characters() -> None:
    tok = build_tokenizer()
    t = generate("kv_lookup", 3, random.Random(0))
    assert len(prompt_ids(tok, t.prompt)) == 2048 + 2  # <|user|> ... <|assistant|>


def test_records_sit_at_every_depth() -> None:
    depths = [generate("kv_lookup", 4, random.Random(s)).depths[0] for s in range(200)]
    assert min(depths) < 0.1 and max(depths) > 0.9
    assert 0.35 < sum(depths) / len(depths) < 0.65


def test_decoys_share_the_shape_of_the_answer() -> None:
    t = generate("kv_lookup", 2, random.Random(4))
    records = re.findall(rf"The code of {NAME[3:-3]} is \d{{4}}\.", t.prompt)
    assert len(records) == 4 and t.gold in records


@pytest.mark.parametrize("name", sorted(FAMILY))
def test_contract_and_exact_scoring(name: str) -> None:
    d = FAMILY[name]
    assert name in registry().domains and list(d.levels) == list(range(len(LEVEL_CHARS)))
    report = check_domain(d, samples=2, seed=5)
    assert report.ok, report.failures
    t = d.task("eval", 0, 1, seed=5)
    assert d.verify(t, t.gold).score == 1.0
    assert d.verify(t, f"  {t.gold}\n").score == 1.0
    k = max(0, len(t.gold) - 3)  # a digit of the (last) code (or the digit), or a letter of the
    # line's last word
    wrong = t.gold[:k] + ("1" if t.gold[k] != "1" else "2") + t.gold[k + 1 :]
    assert d.verify(t, wrong).score == 0.0
    assert d.verify(t, t.gold[:-1] or "The secret digit").score == 0.0  # no partial credit
    assert d.verify(t, t.gold + " " + t.gold).score == 0.0


@pytest.mark.parametrize("name", sorted(FAMILY))
def test_held_out_sets_of_128_distinct_prompts_per_level(name: str) -> None:
    d = FAMILY[name]
    for level in (1, 4):
        ps = build_prompt_set({name: d}, 128, seed=3, level=level)
        assert ps.distinct[name] == 128 and not ps.short
        train = {d.task("train", i, level, 3).prompt for i in range(64)}
        assert not train & {t.prompt for t in ps.tasks[name]}


def test_bad_levels_and_kinds_are_refused() -> None:
    with pytest.raises(ValueError, match="level must be in"):
        level_chars(len(LEVEL_CHARS))
    with pytest.raises(ValueError, match="unknown retrieval kind"):
        generate("needle_in_haystack", 0, random.Random(0))


def test_pad_text_is_exact() -> None:
    rng = random.Random(0)
    for n in range(0, 40):
        assert len(pad_text(rng, n)) == n


def test_digit_needle_has_one_record_and_every_digit() -> None:
    tasks = [generate("digit_needle", 1, random.Random(s)) for s in range(200)]
    assert {t.gold for t in tasks} == set("0123456789")
    assert all(t.prompt.count("secret digit is") == 1 for t in tasks)
    with pytest.raises(ValueError, match="records=2"):
        GENERATORS["digit_needle"](random.Random(0), 512, 2)
