"""The domain contract over the registered domains, sampled, and the size of the registry.

The default run checks every non-reasoning-gym domain except the slow code ones (those: two
sampled) plus ``RG_SAMPLE`` reasoning-gym domains, one task per split and level; set
``MRL_DOMAIN_SAMPLE_SEED`` to rotate the sample (CI may pass the date). The ``slow`` test runs
the contract over every domain, as ``megatron-rl domains check`` does (~6.5 min on 2 busy
cores); it runs only with ``MRL_CHECK_ALL_DOMAINS=1``.
"""

from __future__ import annotations

import os
import random
from collections import Counter

import pytest

from megatron_rl.domains import load_domains, registry
from megatron_rl.domains.contract import BAD_ANSWERS, check_domain

RG_SAMPLE = 16
SEED = int(os.environ.get("MRL_DOMAIN_SAMPLE_SEED", "0"))
FAMILIES = {"rg", "math", "code", "tool", "long_context", "format", "safety"}


def _sample() -> list[str]:
    names = sorted(load_domains())
    rng = random.Random(SEED)
    rg = [n for n in names if n.startswith("rg/")]
    code = [n for n in names if n.startswith("code/")]
    rest = [n for n in names if not n.startswith(("rg/", "code/"))]
    return sorted(rest + rng.sample(code, 2) + rng.sample(rg, RG_SAMPLE))


def test_registry_has_300_domains_in_all_families():
    domains = load_domains()
    fams = Counter(d.family for d in domains.values())
    assert len(domains) >= 300, fams
    assert FAMILIES <= set(fams), fams
    assert not registry().errors, registry().errors
    for d in domains.values():
        assert d.tier in ("core", "long_tail") and list(d.levels) == sorted(d.levels)


def test_bad_answers_are_what_the_contract_says():
    assert len(BAD_ANSWERS["huge"]) >= 1_000_000 and BAD_ANSWERS["empty"] == ""
    assert not any(c.isdigit() or c.isascii() for c in BAD_ANSWERS["unicode_noise"])


@pytest.mark.parametrize("name", _sample())
def test_contract_sampled(name):
    rep = check_domain(load_domains()[name], samples=1, seed=SEED)
    assert rep.ok, rep.failures


@pytest.mark.slow
@pytest.mark.skipif(
    not os.environ.get("MRL_CHECK_ALL_DOMAINS"), reason="set MRL_CHECK_ALL_DOMAINS=1"
)
def test_contract_all_domains():
    bad = {}
    for name, d in load_domains().items():
        rep = check_domain(d, samples=2, seed=SEED)
        if not rep.ok:
            bad[name] = rep.failures[:3]
    assert not bad, bad
