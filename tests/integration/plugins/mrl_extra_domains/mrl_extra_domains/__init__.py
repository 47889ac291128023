"""A third-party domain package (test fixture): reverse a word. Installed with pip in the tests."""

from __future__ import annotations

import random
from typing import Any

from megatron_rl.domains import Domain, Task

WORDS = [
    "planet",
    "copper",
    "lantern",
    "meadow",
    "harbor",
    "violin",
    "quartz",
    "tundra",
    "saddle",
    "falcon",
    "ember",
    "orchid",
    "pebble",
    "canyon",
    "glacier",
    "thimble",
]


class ReverseWord(Domain):
    name = "extra/reverse_word"
    family = "extra"
    tier = "long_tail"
    tags = ("third_party",)
    levels = (1, 2)

    def generate(self, level: int, rng: random.Random) -> tuple[str, str, dict[str, Any]]:
        word = "".join(rng.choice(WORDS) for _ in range(level))
        return f"Spell '{word}' backwards.", word[::-1], {}

    def score(self, task: Task, answer: str) -> tuple[float, dict[str, Any]]:
        return float(answer.strip() == task.gold), {}


def domains() -> list[Domain]:
    return [ReverseWord()]
