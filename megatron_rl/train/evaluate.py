"""Held-out evaluation: greedy answers from the rollout engine, scored by each domain's verifier.

The same function serves SFT (accuracy of the base model), the RL loop (before/after and periodic
sweeps) and the scheduler's seesaw guard (per-task scores). Eval tasks come from each domain's
held-out split, which is disjoint from its training split by construction (see
``megatron_rl/domains/base.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from megatron_rl.domains import Domain
from megatron_rl.model.tokenizer import prompt_ids
from megatron_rl.rollout.base import GenRequest, RolloutEngine, SamplingParams


@dataclass
class EvalResult:
    """Per-domain accuracy plus per-task scores and the tasks still failed."""

    accuracy: dict[str, float] = field(default_factory=dict)  # domain -> mean score
    scores: dict[str, list[float]] = field(default_factory=dict)  # domain -> per-task scores
    failures: list[dict[str, Any]] = field(default_factory=list)  # failed tasks + responses

    @property
    def mean(self) -> float:
        return sum(self.accuracy.values()) / max(1, len(self.accuracy))


def eval_level(domain: Domain, fixed: int | None, levels: dict[str, int] | None = None) -> int:
    """The difficulty evaluated: a fixed level, the scheduler's current one, or the easiest."""
    if fixed is not None:
        return fixed if fixed in domain.levels else domain.levels[0]
    if levels and domain.name in levels:
        return levels[domain.name]
    return domain.levels[0]


def evaluate(
    engine: RolloutEngine,
    tokenizer: Any,
    domains: dict[str, Domain],
    n_per_domain: int,
    seed: int,
    max_tokens: int,
    level: int | None = None,
    levels: dict[str, int] | None = None,
) -> EvalResult:
    """Greedy-decode ``n_per_domain`` held-out tasks per domain and score them."""
    tasks, requests = [], []
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, n=1, seed=seed)
    for name, d in domains.items():
        lv = eval_level(d, level, levels)
        for i in range(n_per_domain):
            task = d.task("eval", i, lv, seed)
            tasks.append(task)
            requests.append(GenRequest(prompt_ids(tokenizer, task.prompt), params, tag=name))
    outputs = engine.generate(requests)
    result = EvalResult()
    for task, outs in zip(tasks, outputs, strict=True):
        text = outs[0].text
        verdict = domains[task.domain].verify(task, text)
        result.scores.setdefault(task.domain, []).append(verdict.score)
        if verdict.score < 1.0:
            result.failures.append({**task.to_dict(), "response": text, "score": verdict.score})
    result.accuracy = {k: sum(v) / len(v) for k, v in result.scores.items()}
    return result
