"""The tinymix/* domains: registered only with base-model signal, and the constructed pair
really conflicts (same questions, conflicting answer conventions)."""

from __future__ import annotations

import re

from domains.tiny_mix import NEEDS_RETRAINING, SPECS, mix_domains
from megatron_rl.domains import load_domains

PAIR = ("tinymix/add", "tinymix/add_last_digit")
QUESTION = re.compile(r"(\d+) \+ (\d+)")  # "Calculate 7 + 8." (reasoning-gym allows 10)


def test_registered_set_excludes_candidates_without_signal() -> None:
    names = {n for n in load_domains(["tinymix/*"])}
    assert len(names) == len(SPECS) - len(NEEDS_RETRAINING) + 1  # + the last-digit partner
    assert not {f"tinymix/{n}" for n in NEEDS_RETRAINING} & names
    assert {d.name for d in mix_domains(include_all=True)} >= names | {"tinymix/products"}
    tiny = load_domains(["tiny/*"])
    assert len(tiny) == 5 and all(d.family == "tiny" for d in tiny.values())  # demo unchanged
    assert all(d.family == "tinymix" for d in load_domains(["tinymix/*"]).values())


def test_interfering_pair_same_questions_conflicting_answers() -> None:
    full, last = (load_domains(list(PAIR))[n] for n in PAIR)
    conflicts = 0
    for i in range(40):
        for d in (full, last):
            t = d.task("train", i, 0, seed=3)
            a, b = map(int, QUESTION.search(t.prompt).groups())  # same question format
            assert t.gold == str(a + b if d is full else (a + b) % 10)
            conflicts += d is last and a + b >= 10
    assert conflicts >= 5  # sums >= 10: the two conventions disagree
    t = next(t for t in (last.task("eval", i, 0, 3) for i in range(60)) if big(t.prompt))
    a, b = map(int, QUESTION.search(t.prompt).groups())
    assert last.verify(t, str((a + b) % 10)).score == 1.0
    assert last.verify(t, str(a + b)).score == 0.0  # the full sum is wrong under this convention
    tf = next(t for t in (full.task("eval", i, 0, 3) for i in range(60)) if big(t.prompt))
    assert full.verify(tf, tf.gold).score == 1.0
    assert full.verify(tf, str(int(tf.gold) % 10)).score == 0.0


def big(prompt: str) -> bool:
    """The question's sum is >= 10 (where the two conventions conflict)."""
    return sum(map(int, QUESTION.search(prompt).groups())) >= 10
