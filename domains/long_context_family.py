"""Long-context domains: needle retrieval, multi-hop key-value chains, document synthesis.

The generators live in ``long_context/tasks.py``; this plugin wraps each kind as one domain,
``long_context/<kind>``, whose difficulty levels are prompt lengths (the length curriculum):
level 0 = 1k tokens, doubling up to level 7 = 128k tokens (``long_context.tasks.LEVEL_TOKENS``).
``kv_chain`` also adds hops as levels rise (2 hops at 1k-2k, 5 hops at 64k-128k).

Lengths are counted at ``CHARS_PER_TOKEN`` (4) characters per token unless the domain is built
with a tokenizer's counting function; with the byte-level tiny tokenizer a level-0 prompt is
therefore ~4k tokens. Answers are a number (code, value or total); scoring is exact match after
light normalisation (``<answer>`` block or first line, digit commas and a trailing period removed).

Entry point (pyproject): ``long_context = "domains.long_context_family:domains"``.
"""

from __future__ import annotations

import random
from typing import Any

from long_context import tasks
from megatron_rl.domains.base import Domain, Task

DESCRIPTIONS = {
    "needle": "find one secret code hidden among decoys in a long document",
    "kv_chain": "follow a chain of key -> key links scattered through a long document",
    "doc_synthesis": "add up records spread over a long document",
}


class LongContextDomain(Domain):
    """One long-context task kind; levels are prompt lengths (see module docstring)."""

    family = "long_context"
    tier = "long_tail"
    levels = tuple(range(len(tasks.LEVEL_TOKENS)))
    time_budget_s = 0.5

    def __init__(self, kind: str, count_tokens: tasks.TokenCounter | None = None) -> None:
        if kind not in tasks.GENERATORS:
            raise ValueError(f"unknown long-context kind {kind!r}; choose one of {list(DESCRIPTIONS)}")
        self.kind = kind
        self.name = f"long_context/{kind}"
        self.tags = ("long_context", kind, "retrieval" if kind == "needle" else "reasoning")
        self.count_tokens = count_tokens

    def generate(self, level: int, rng: random.Random) -> tuple[str, str, dict[str, Any]]:
        seed = rng.randrange(2**62)
        t = tasks.generate(self.kind, seed, level, self.count_tokens)
        return t.prompt, t.gold, {**t.meta, "num_tokens": t.num_tokens, "gen_seed": seed}

    def score(self, task: Task, answer: str) -> tuple[float, dict[str, Any]]:
        norm = tasks.normalize(answer)
        return (1.0 if norm == task.gold else 0.0), {"answer": norm, "parsable": bool(norm)}


def domains() -> list[Domain]:
    """Entry point: one domain per long-context task kind."""
    return [LongContextDomain(kind) for kind in tasks.GENERATORS]
