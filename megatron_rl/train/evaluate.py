"""Held-out evaluation: greedy answers from the rollout engine, scored by each domain's verifier.

The same function serves SFT (accuracy of the base model), the RL loop (before/after and periodic
sweeps) and the scheduler's seesaw guard (per-task scores). Eval tasks come from each domain's
held-out split, which is disjoint from its training split by construction (see
``megatron_rl/domains/base.py``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from megatron_rl.domains import Domain, Task, VerifyResult
from megatron_rl.model.tokenizer import prompt_ids
from megatron_rl.rollout.base import GenRequest, RolloutEngine, SamplingParams
from megatron_rl.train.episodes import run_episodes

log = logging.getLogger(__name__)


@dataclass
class EvalResult:
    """Per-domain accuracy plus per-task scores and the tasks still failed."""

    accuracy: dict[str, float] = field(default_factory=dict)  # domain -> mean score
    scores: dict[str, list[float]] = field(default_factory=dict)  # domain -> per-task scores
    verifier_errors: int = 0  # verifications that raised (scored 0)
    records: list[tuple[Task, str, float]] = field(default_factory=list)  # (task, response, score)

    @property
    def mean(self) -> float:
        return sum(self.accuracy.values()) / max(1, len(self.accuracy))

    def metrics(self) -> dict[str, float]:
        """``eval/<domain>/accuracy``, ``eval/mean_accuracy`` and ``eval/verifier_errors``."""
        out = {f"eval/{k}/accuracy": v for k, v in self.accuracy.items()}
        out["eval/mean_accuracy"] = self.mean
        out["eval/verifier_errors"] = float(self.verifier_errors)
        return out


def safe_verify(domain: Domain, task: Task, response: str) -> VerifyResult | None:
    """``domain.verify`` that never raises: a failure is logged with its input, None returned."""
    try:
        return domain.verify(task, response)
    except Exception as e:  # noqa: BLE001 - a broken verifier must not stop a run
        log.warning(
            "verifier of %s raised on task %s: %r (response %r)",
            domain.name,
            task.id,
            e,
            response[:200],
        )
        return None


def eval_level(domain: Domain, fixed: int | None, index: int) -> int:
    """Level of the ``index``-th eval task: a fixed level, else stratified over all levels.

    The eval set is the same at every sweep (it never follows the curriculum), so sweeps are
    comparable and a promotion is not mistaken for a regression by the seesaw guard.
    """
    if fixed is not None:
        return fixed if fixed in domain.levels else domain.levels[0]
    return domain.levels[index % len(domain.levels)]


def evaluate(
    engine: RolloutEngine,
    tokenizer: Any,
    domains: dict[str, Domain],
    n_per_domain: int,
    seed: int,
    max_tokens: int,
    level: int | None = None,
    stop: list[str] | None = None,
) -> EvalResult:
    """Greedy-decode ``n_per_domain`` held-out tasks per domain and score them.

    Single-turn domains get one engine call for all their tasks; multi-turn domains (tool use)
    run their episodes with the environment, as in training, and are scored on the last model
    turn. ``stop``: the run's ``rollout.stop`` strings, as in training.
    """
    tasks = [
        d.task("eval", i, eval_level(d, level, i), seed)
        for d in domains.values()
        for i in range(n_per_domain)
    ]
    texts = _responses(engine, tokenizer, domains, tasks, seed, max_tokens, stop)
    result = EvalResult()
    for task, text in zip(tasks, texts, strict=True):
        verdict = safe_verify(domains[task.domain], task, text)
        score = verdict.score if verdict is not None else 0.0
        result.verifier_errors += verdict is None
        result.scores.setdefault(task.domain, []).append(score)
        result.records.append((task, text, score))
    result.accuracy = {k: sum(v) / len(v) for k, v in result.scores.items()}
    return result


def _responses(
    engine: RolloutEngine,
    tokenizer: Any,
    domains: dict[str, Domain],
    tasks: list[Task],
    seed: int,
    max_tokens: int,
    stop: list[str] | None,
) -> list[str]:
    """The greedy response to each task (the last model turn for multi-turn domains)."""
    from megatron_rl.scheduler import GroupSpec
    from megatron_rl.train.rollout_phase import Group

    single = [i for i, t in enumerate(tasks) if not domains[t.domain].multi_turn]
    multi = [i for i, t in enumerate(tasks) if domains[t.domain].multi_turn]
    texts = [""] * len(tasks)
    params = SamplingParams(
        temperature=0.0, max_tokens=max_tokens, n=1, seed=seed, stop=list(stop or [])
    )
    requests = [
        GenRequest(prompt_ids(tokenizer, tasks[i].prompt), params, tag=tasks[i].domain)
        for i in single
    ]
    for i, outs in zip(single, engine.generate(requests) if requests else [], strict=True):
        texts[i] = outs[0].text
    if multi:
        groups = [Group(GroupSpec(tasks[i].domain, tasks[i].level, 0.0), tasks[i]) for i in multi]
        run_episodes(engine, tokenizer, domains, groups, 1, max_tokens, 1.0, stop)
        for i, g in zip(multi, groups, strict=True):
            texts[i] = g.samples[0].text
    return texts
