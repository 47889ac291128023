"""The pre-screen: a few groups per domain at the base policy decide which domains the mix plans.

At hundreds of domains most are solved or out of reach for the current policy, and their groups
carry no reward variance: generation spent for no gradient. ``scheduler.prescreen_groups: K``
spends ``K`` groups per domain once, before step 0, and keeps in the mix only the domains where
any of them had reward variance. In the many-domain study (docs/scheduler.md, "Hundreds of
domains") this static screen, charged to the rollout budget, beat uniform + zero-variance filter
and was not beaten by the adaptive mix.

The screen draws training prompts at indices ``SCREEN_INDEX + i``, apart from the run's own task
cursor (which counts up from 0), at each domain's first level, and samples every group with the
run's seed as its sampling seed, so it depends on the base weights and the seed only: a run and
the study's pre-screen arm (``benchmarks/studies/many_domains.py``) screen alike. Multi-turn
domains (their groups are episodes, not one engine call) and domains whose prompts could not be
drawn or do not fit the policy are kept unscreened: the screen only ever removes a domain on
evidence.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from megatron_rl.domains.base import Domain, Task, VerifyResult
from megatron_rl.evaluation.evaluate import safe_verify
from megatron_rl.model.tokenizer import prompt_ids
from megatron_rl.rollout.base import GenRequest, RolloutEngine, SamplingParams

log = logging.getLogger(__name__)

SCREEN_INDEX = 10**6  # the screen's training prompts start here (the run's cursor starts at 0)

Draw = Callable[[Sequence[tuple[str, int, int]], int], list[Task | None]]
Verify = Callable[[Sequence[tuple[Task, str]]], list[VerifyResult | None]]


@dataclass
class Screen:
    """What the pre-screen found (JSON-ready: ``prescreen.json`` in the run directory)."""

    groups: int = 0  # groups generated (charged to the rollout budget)
    signal: list[str] = field(default_factory=list)  # screened: reward variance in some group
    flat: list[str] = field(default_factory=list)  # screened: every group without variance
    unscreened: list[str] = field(default_factory=list)  # multi-turn, undrawn or too long
    seconds: float = 0.0

    @property
    def kept(self) -> list[str]:
        """The domains the mix keeps planning; every domain when the screen found no signal."""
        kept = sorted(self.signal + self.unscreened)
        return kept or sorted(self.flat)

    def to_json(self) -> dict[str, Any]:
        return {
            "groups": self.groups,
            "signal": self.signal,
            "flat": self.flat,
            "unscreened": self.unscreened,
            "kept": self.kept,
            "seconds": self.seconds,
        }


def _inline_draw(domains: dict[str, Domain]) -> Draw:
    def draw(wanted: Sequence[tuple[str, int, int]], seed: int) -> list[Task | None]:
        return [domains[d].task("train", i, lv, seed) for d, i, lv in wanted]

    return draw


def prescreen(
    engine: RolloutEngine,
    tokenizer: Any,
    domains: dict[str, Domain],
    *,
    groups: int,
    group_size: int,
    seed: int,
    max_tokens: int,
    temperature: Callable[[str], float] | float = 1.0,
    stop: Sequence[str] = (),
    draw: Draw | None = None,
    verify: Verify | None = None,
    fits: Callable[[Task], bool] | None = None,
) -> Screen:
    """Screen every domain with ``groups`` groups of ``group_size`` (module docstring).

    ``draw`` and ``verify``: the run's deadlined domain calls (``DomainGuard.tasks`` and
    ``.verify``); without them the domains are called inline. ``fits``: whether a task's prompt
    fits the policy (a task that does not is not generated). ``temperature``: one for all
    domains, or per domain (the run's base temperatures).
    """
    if groups < 1 or group_size < 2:
        raise ValueError(
            f"prescreen needs groups >= 1 per domain and a group size >= 2 (a group of one has no "
            f"variance), got {groups} and {group_size}"
        )
    t0 = time.time()
    single = [n for n, d in domains.items() if not d.multi_turn]
    wanted = [(n, SCREEN_INDEX + i, domains[n].levels[0]) for n in single for i in range(groups)]
    drawn = (draw or _inline_draw(domains))(wanted, seed)
    tasks = [t for t in drawn if t is not None and (fits is None or fits(t))]
    temp = temperature if callable(temperature) else (lambda _name, _t=temperature: _t)
    requests = [
        GenRequest(
            prompt_ids(tokenizer, t.prompt),
            SamplingParams(
                temperature=temp(t.domain),
                max_tokens=max_tokens,
                n=group_size,
                seed=seed,
                stop=list(stop),
            ),
            tag=t.domain,
        )
        for t in tasks
    ]
    outs = engine.generate(requests) if requests else []
    pairs = [(t, c.text) for t, o in zip(tasks, outs, strict=True) for c in o]
    verdicts = (
        verify(pairs)
        if verify is not None
        else [safe_verify(domains[t.domain], t, r) for t, r in pairs]
    )
    screened: set[str] = set()
    signal: set[str] = set()
    it = iter(verdicts)
    for t, o in zip(tasks, outs, strict=True):
        # a failed verification scores 0, as in training
        rewards = {v.score if v is not None else 0.0 for v in (next(it) for _ in o)}
        screened.add(t.domain)
        if len(rewards) > 1:
            signal.add(t.domain)
    screen = Screen(
        groups=len(tasks),
        signal=sorted(signal),
        flat=sorted(screened - signal),
        unscreened=sorted(set(domains) - screened),  # multi-turn, undrawn or too long
        seconds=round(time.time() - t0, 1),
    )
    if not screen.signal and not screen.unscreened:
        log.warning(
            "prescreen: no group of %d domains had reward variance; the mix keeps all of them",
            len(screen.flat),
        )
    log.info(
        "prescreen: %d groups, %d domains with signal, %d without, %d unscreened (%.1f s)",
        screen.groups,
        len(screen.signal),
        len(screen.flat),
        len(screen.unscreened),
        screen.seconds,
    )
    return screen
