"""Long-context domains: a thin plugin over the generators in ``long_context/tasks.py``.

The generators (needle retrieval, multi-hop key-value chains, document synthesis) and their
verifier belong to the long-context part; this plugin only adapts them to the domain API.
Names are ``long_context/<kind>``; levels 0-7 are that module's length curriculum
(``LEVEL_TOKENS``: 1k ... 128k tokens, estimated at 4 characters per token, so level 7 prompts
are ~0.5 MB of text), so the scheduler's curriculum is a length curriculum.
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


def domains() -> list[Domain]:
    from long_context.tasks import GENERATORS, LEVEL_TOKENS

    return [LongContextDomain(kind, len(LEVEL_TOKENS)) for kind in GENERATORS]
