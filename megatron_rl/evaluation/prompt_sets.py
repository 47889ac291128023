"""The fixed prompts an eval scores: per domain, distinct tasks of one split, each once.

Tasks are drawn by index from the split (``Domain.task(split, i, level, seed)``, i = 0, 1, ...)
and a prompt already drawn is skipped, until the requested number of distinct prompts is found
or ``DRAW_FACTOR`` draws per requested prompt are spent. A split smaller than the request thus
gives what it holds (each prompt once, never repeated to fill the count), and the shortfall is
logged once when the set is built, with the number found and the estimated size of the split
(:func:`megatron_rl.domains.sizes.estimate_space` on the draws made).

Without a fixed level the request is stratified over the domain's levels (the first
``n % levels`` levels get one more); each level draws from its own index stream. The set is a
pure function of (domains, n, level, seed, split): the RL loop builds it once at start-up and
scores the same prompts at every sweep, so sweeps pair prompt by prompt.

The training-prompt sample (``split="train"``) takes the first distinct training tasks in index
order, which are also the first tasks the RL loop's task cursors hand out (and, for small
spaces, prompts the base model's SFT saw many times): its accuracy beside the held-out accuracy
is the memorisation gap.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from megatron_rl.domains import Domain, Task
from megatron_rl.domains.draws import DRAW_FACTOR, MIN_DRAWS, draw_distinct, level_quotas

if TYPE_CHECKING:
    from megatron_rl.domains.workers import DomainWorkers
    from megatron_rl.evaluation.prompt_cache import PromptCache

log = logging.getLogger(__name__)

__all__ = [  # the draw itself lives in megatron_rl/domains/draws.py (the workers run it)
    "DRAW_FACTOR",
    "MIN_DRAWS",
    "Drawing",
    "PromptSet",
    "build_prompt_set",
    "draw_distinct",
    "level_quotas",
]


@dataclass
class PromptSet:
    """Distinct tasks per domain from one split; ``short`` lists the domains that ran out."""

    split: str  # "eval" (held out) or "train" (the memorisation sample)
    requested: int  # distinct prompts asked for per domain
    tasks: dict[str, list[Task]] = field(default_factory=dict)  # domain -> its distinct tasks
    draws: dict[str, int] = field(default_factory=dict)  # domain -> task draws made
    estimate: dict[str, float] = field(default_factory=dict)  # domain -> estimated split size
    cut: dict[str, str] = field(default_factory=dict)  # domain -> why its set is cut short
    # (time budget, generator failure, prompts too long for the policy)

    @property
    def distinct(self) -> dict[str, int]:
        return {k: len(v) for k, v in self.tasks.items()}

    @property
    def short(self) -> list[str]:
        """Domains whose split gave fewer distinct prompts than requested."""
        return [k for k, v in self.tasks.items() if len(v) < self.requested]


@dataclass
class Drawing:
    """How a run draws its sets: in the domain workers (in parallel, each domain under a time
    budget: drawing stops after ``budget_s``, a worker is killed at ``budget_s + timeout_s``),
    through the cache, keeping only prompts that ``fits`` (the policy's context)."""

    workers: DomainWorkers
    budget_s: float = 30.0
    timeout_s: float = 10.0
    cache: PromptCache | None = None
    fits: Callable[[Task], bool] | None = None


def build_prompt_set(
    domains: dict[str, Domain],
    n: int,
    seed: int,
    level: int | None = None,
    split: str = "eval",
    drawing: Drawing | None = None,
) -> PromptSet:
    """The distinct-prompt set of every domain; logs each domain whose split fell short, once.
    ``drawing``: the run's way (workers, budget, cache, fit); without it, drawn inline here."""
    out = PromptSet(split, n)
    drawn, failed = _drawn(domains, n, seed, level, split, drawing) if drawing else ({}, {})
    for name, d in domains.items():
        if drawing is None:
            tasks, draws, size = draw_distinct(d, split, n, level, seed)
        else:
            tasks, draws, size = drawn[name]
            if name in failed:
                out.cut[name] = failed[name]
            elif math.isnan(size):
                out.cut[name] = f"drawing stopped at its {drawing.budget_s:g} s budget"
            if drawing.fits is not None:
                fit = [t for t in tasks if drawing.fits(t)]
                if len(fit) < len(tasks):
                    out.cut[name] = f"{len(tasks) - len(fit)} prompts too long for the policy"
                tasks = fit
        out.tasks[name], out.draws[name], out.estimate[name] = tasks, draws, size
        if name in out.cut:
            why = out.cut[name]
            log.warning(
                "%s prompt set of %s: %d of %d prompts (%s)", split, name, len(tasks), n, why
            )
        elif len(tasks) < n:
            est = "no repeat seen" if size == float("inf") else f"estimated size ~{size:.0f}"
            log.warning(
                "%s split of %s holds %d distinct prompts, fewer than the %d requested "
                "(%d draws, %s): each is scored once, the count is logged as %s/%s/distinct",
                split,
                name,
                len(tasks),
                n,
                draws,
                est,
                "eval" if split == "eval" else "eval_train",
                name,
            )
    return out


def _drawn(
    domains: dict[str, Domain],
    n: int,
    seed: int,
    level: int | None,
    split: str,
    drawing: Drawing,
) -> tuple[dict[str, tuple[list[Task], int, float]], dict[str, str]]:
    """Every domain's draw (from the cache, else in the workers, all domains in parallel), and
    the failure of each domain whose generator failed or stalled past the deadline."""
    from megatron_rl.domains.workers import Call

    out: dict[str, tuple[list[Task], int, float]] = {}
    failed: dict[str, str] = {}
    calls = []
    for name, d in domains.items():
        hit = drawing.cache.get(d, level, split, seed, n) if drawing.cache else None
        if hit is not None:
            out[name] = hit
        else:
            args = (split, n, level, seed, drawing.budget_s)
            calls.append(Call("draw", name, args, drawing.budget_s + drawing.timeout_s))
    t0 = time.time()

    marks = {len(calls) * q // 4: q * 25 for q in (1, 2, 3)}  # progress lines at 25/50/75%

    def done(call: Call, o: Any) -> None:  # cached as each arrives: a crash loses none of them
        pct = marks.get(len(out) - (len(domains) - len(calls)) + 1)
        if pct is not None:
            took = time.time() - t0
            log.info("%s prompt sets: %d%% of %d drawn (%.0f s)", split, pct, len(calls), took)
        if not o.ok:
            failed[call.domain] = f"generator {o.failure}: {o.message}"
            out[call.domain] = [], 0, math.nan
            return
        out[call.domain] = o.value
        if drawing.cache is not None:  # a set cut by the budget too (not drawn again next time)
            drawing.cache.put(domains[call.domain], level, split, seed, n, o.value)

    drawing.workers.run(calls, done=done, chunk=1)
    if calls:
        log.info(
            "%s prompt sets: %d drawn in %.1f s, %d from the cache",
            split,
            len(calls),
            time.time() - t0,
            len(domains) - len(calls),
        )
    return out, failed
