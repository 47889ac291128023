"""Distinct tasks of one split: the draw behind every prompt set (megatron_rl/evaluation/
prompt_sets.py has the rules). It lives with the domain API so that the domain workers
(:mod:`megatron_rl.domains.workers`) can run it without importing the evaluation package.
"""

from __future__ import annotations

import math
import time

from megatron_rl.domains.base import Domain, Task
from megatron_rl.domains.sizes import estimate_space


class DrawInterrupted(BaseException):
    """Raised into a draw by the worker's alarm just before its hard deadline: the draw returns
    what it has (a BaseException, so ``Domain.task``'s skip-a-failed-draw cannot swallow it)."""


DRAW_FACTOR = 4  # task draws per requested prompt before a split is declared too small
MIN_DRAWS = 64  # draws always allowed per level, however few prompts it is asked for


def level_quotas(domain: Domain, n: int, level: int | None) -> list[tuple[int, int]]:
    """``(level, prompts)`` pairs: all ``n`` at a fixed level, else ``n`` spread over levels.

    A fixed level the domain lacks falls back to its easiest (a shared ``domains.level`` may
    not exist in every selected domain).
    """
    if level is not None:
        return [(level if level in domain.levels else domain.levels[0], n)]
    k = len(domain.levels)
    return [
        (lv, n // k + (i < n % k)) for i, lv in enumerate(domain.levels) if n // k + (i < n % k)
    ]


def draw_distinct(
    domain: Domain,
    split: str,
    n: int,
    level: int | None,
    seed: int,
    budget_s: float = math.inf,
) -> tuple[list[Task], int, float]:
    """Up to ``n`` tasks of ``split`` with distinct prompts; also the draws made and the split's
    estimated size (summed over levels; ``inf`` where no prompt repeated). Drawing stops before
    a draw that would likely end past ``budget_s`` (the mean draw so far added to the time
    spent), so a slow generator overshoots by one draw at most (the estimate is then nan: the
    split was not explored)."""
    if split not in domain.splits:  # a task file may hold one split only
        return [], 0, 0.0
    seen: set[str] = set()
    tasks: list[Task] = []
    draws, size = 0, 0.0
    start = time.monotonic()
    for lv, quota in level_quotas(domain, n, level):
        found, made = 0, 0
        cap = max(MIN_DRAWS, DRAW_FACTOR * quota)
        while found < quota and made < cap:
            spent = time.monotonic() - start
            if spent + spent / max(1, draws + made) > budget_s:
                return tasks, draws + made, math.nan
            try:
                task = domain.task(split, made, lv, seed)
            except DrawInterrupted:
                return tasks, draws + made, math.nan
            made += 1
            if task.prompt in seen:
                continue
            seen.add(task.prompt)
            tasks.append(task)
            found += 1
        draws += made
        size += estimate_space(made, found)
    return tasks, draws, size
