"""The long-context domain family plugin (domains/long_context_family.py) on the domain API."""

from __future__ import annotations

import pytest

from domains.long_context_family import LongContextDomain, domains
from long_context.tasks import CHARS_PER_TOKEN, LEVEL_TOKENS
from megatron_rl.domains.registry import Registry

BAD_ANSWERS = ["", "no idea", "x" * 1_000_000, "\u202e\x00\ud7ff\ufffd" * 500]


def test_family_registers_three_domains() -> None:
    reg = Registry()
    reg.add("long_context", "domains.long_context_family:domains", domains())
    assert sorted(reg.domains) == [
        "long_context/doc_synthesis",
        "long_context/kv_chain",
        "long_context/needle",
    ]
    assert not reg.errors
    info = reg.domains["long_context/needle"].describe()
    assert info["family"] == "long_context" and info["difficulty"] == [0, 7]


@pytest.mark.parametrize("domain", domains(), ids=lambda d: d.name)
def test_contract(domain: LongContextDomain) -> None:
    for level in (0, 3):
        train = [domain.task("train", i, level, seed=5) for i in range(4)]
        again = [domain.task("train", i, level, seed=5) for i in range(4)]
        evals = [domain.task("eval", i, level, seed=5) for i in range(4)]
        assert [t.prompt for t in train] == [t.prompt for t in again]
        assert not {t.prompt for t in train} & {t.prompt for t in evals}
        for t in train + evals:
            assert domain.verify(t, t.gold).score == 1.0
            assert domain.verify(t, f"<answer>{t.gold}</answer>").score == 1.0
            for bad in BAD_ANSWERS:
                res = domain.verify(t, bad)
                assert res.score == 0.0
                assert res.duration_s < domain.time_budget_s


@pytest.mark.parametrize("level", [0, 4, 7])
def test_levels_are_lengths(level: int) -> None:
    t = LongContextDomain("needle").task("train", 0, level)
    approx_tokens = len(t.prompt) / CHARS_PER_TOKEN
    assert abs(approx_tokens - LEVEL_TOKENS[level]) <= 0.02 * LEVEL_TOKENS[level] + 1
    assert t.meta["num_tokens"] == round(len(t.prompt) / CHARS_PER_TOKEN)


def test_unknown_kind() -> None:
    with pytest.raises(ValueError, match="choose one of"):
        LongContextDomain("haystack")
