"""The long-context domain family (plugin ``domains/long_context.py`` over long_context/tasks.py).

The shared contract (``megatron_rl/domains/contract.py``) runs on every family in
``tests/integration/test_domains_contract.py``; here: the family's own promises, at every level
(the length curriculum 1k ... 128k) and with answers read back from the generated documents.
"""

from __future__ import annotations

import re

import pytest

from domains.long_context import domains
from long_context.tasks import CHARS_PER_TOKEN, GENERATORS, LEVEL_TOKENS
from megatron_rl.domains.contract import check_domain
from megatron_rl.domains.registry import registry

# the token-estimated set (long_context/tasks.py); the retrieval family has its own tests
# (tests/unit/test_long_context_retrieval.py: exact lengths in characters)
FAMILY = {d.name: d for d in domains() if d.name.split("/")[1] in GENERATORS}


def test_registered_through_the_entry_point() -> None:
    reg = registry()
    for name in ("long_context/needle", "long_context/kv_chain", "long_context/doc_synthesis"):
        assert name in reg.domains
        assert reg.domains[name].describe()["difficulty"] == [0, len(LEVEL_TOKENS) - 1]


@pytest.mark.parametrize("name", sorted(FAMILY))
def test_contract_at_every_level(name: str) -> None:
    d = FAMILY[name]
    report = check_domain(d, samples=2, seed=3)
    assert report.ok, report.failures
    for level in d.levels:
        t = d.task("train", 0, level, seed=3)
        target = LEVEL_TOKENS[level]
        assert abs(len(t.prompt) / CHARS_PER_TOKEN - target) <= 0.02 * target + 1
        assert d.verify(t, f"<answer>{t.gold}</answer>").score == 1.0
        assert d.verify(t, str(int(t.gold) + 1)).score == 0.0


def test_needle_gold_is_in_the_document() -> None:
    d = FAMILY["long_context/needle"]
    for i in range(5):
        t = d.task("eval", i, 2, seed=0)
        codes = re.findall(rf"The secret code of {t.meta['name']} is (\d+)\.", t.prompt)
        assert codes == [t.gold]
