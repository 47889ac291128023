"""Long-context domains: a thin plugin over the generators in ``long_context/``.

The generators and their verifiers belong to the long-context part; this plugin only adapts them
to the domain API. Two sets, named ``long_context/<kind>``, whose levels are length curricula:

- ``needle``, ``kv_chain``, ``doc_synthesis`` (``long_context/tasks.py``): levels 0-7 are
  ``LEVEL_TOKENS`` (1k ... 128k tokens, estimated at 4 characters per token, so level 7 prompts
  are ~0.5 MB of text);
- ``kv_lookup``, ``multi_needle``, ``which_line`` (``long_context/retrieval.py``, the family the
  tiny policy learns): levels 0-7 are ``LEVEL_CHARS``, prompts of exactly 256 ... 32768
  characters, i.e. byte-level tokens.
"""

from __future__ import annotations

import random
from typing import Any

from megatron_rl.domains.base import Domain, Task


class LongContextDomain(Domain):
    family = "long_context"
    time_budget_s = 0.5

    def __init__(self, kind: str, n_levels: int) -> None:
        self.kind = kind
        self.name = f"long_context/{kind}"
        self.tags = ("long_context", kind)
        self.levels = tuple(range(n_levels))
        self.tier = "core" if kind == "needle" else "long_tail"

    def generate(self, level: int, rng: random.Random) -> tuple[str, str, dict[str, Any]]:
        from long_context.tasks import generate

        t = generate(self.kind, rng.randrange(2**62), level)
        return t.prompt, t.gold, {"num_tokens": t.num_tokens, **t.meta}

    def score(self, task: Task, answer: str) -> tuple[float, dict[str, Any]]:
        from long_context.tasks import verify

        score, parsable = verify(task.gold, answer)
        return score, {"parsable": parsable}


class RetrievalDomain(Domain):
    """One kind of ``long_context/retrieval.py``; the answer is compared exactly."""

    family = "long_context"
    time_budget_s = 0.5

    def __init__(self, kind: str, n_levels: int) -> None:
        self.kind = kind
        self.name = f"long_context/{kind}"
        self.tags = ("long_context", "retrieval", kind)
        self.levels = tuple(range(n_levels))
        self.tier = "core" if kind == "kv_lookup" else "long_tail"

    def generate(self, level: int, rng: random.Random) -> tuple[str, str, dict[str, Any]]:
        from long_context.retrieval import generate

        t = generate(self.kind, level, rng)
        return t.prompt, t.gold, {"chars": len(t.prompt), "depths": list(t.depths)}

    def score(self, task: Task, answer: str) -> tuple[float, dict[str, Any]]:
        from long_context.retrieval import normalize

        return float(normalize(answer) == task.gold), {"parsable": bool(normalize(answer))}


def domains() -> list[Domain]:
    from long_context import retrieval
    from long_context.tasks import GENERATORS, LEVEL_TOKENS

    out: list[Domain] = [LongContextDomain(kind, len(LEVEL_TOKENS)) for kind in GENERATORS]
    n_levels = len(retrieval.LEVEL_CHARS)
    return out + [RetrievalDomain(kind, n_levels) for kind in retrieval.GENERATORS]
