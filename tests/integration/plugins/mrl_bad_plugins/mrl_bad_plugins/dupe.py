"""A plugin that re-registers a built-in domain name next to one valid new domain."""

from __future__ import annotations

import random
from typing import Any

from megatron_rl.domains import Domain, Task


class Echo(Domain):
    family = "dupe"

    def __init__(self, name: str) -> None:
        self.name = name

    def generate(self, level: int, rng: random.Random) -> tuple[str, str, dict[str, Any]]:
        n = rng.randrange(10**6)
        return f"Repeat {n}.", str(n), {}

    def score(self, task: Task, answer: str) -> tuple[float, dict[str, Any]]:
        return float(answer == task.gold), {}


def domains() -> list[Domain]:
    return [Echo("math/linear_equation"), Echo("dupe/echo")]
