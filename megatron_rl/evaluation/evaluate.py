"""Evaluation on distinct prompts: engine answers, scored by each domain's verifier.

The same function serves SFT (accuracy of the base model), the RL loop (before/after, periodic
sweeps, and the training-prompt sample of the memorisation gap) and the scheduler's seesaw guard
(per-prompt scores). The prompts come from a :class:`~megatron_rl.evaluation.prompt_sets.PromptSet`:
distinct tasks of one split, each scored once; the held-out split is disjoint from training by
construction (``megatron_rl/domains/base.py``).

Two metrics, one code path:

- greedy accuracy (``temperature=0``, ``samples=1``, the default);
- sampled pass@1: ``samples`` completions per prompt at ``temperature``, a prompt scoring the
  mean of its samples. Each prompt's sampling seed derives from the run seed and the task id,
  so a prompt meets the same random numbers at every sweep (common random numbers: sweep-to-sweep
  differences then come from the weights, not the dice), whatever else is in the eval.

Either way a domain's accuracy is the mean over its distinct prompts, and its standard error is
the sample standard deviation of the per-prompt scores over the square root of their number:
the prompt, not the sample, is the unit (k samples of one prompt are not k independent tasks).
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from megatron_rl.domains import Domain, Task, VerifyResult
from megatron_rl.domains.base import stable_int
from megatron_rl.domains.guard import DomainGuard
from megatron_rl.evaluation.prompt_sets import PromptSet, build_prompt_set
from megatron_rl.model.tokenizer import prompt_ids
from megatron_rl.rollout.base import GenRequest, RolloutEngine, SamplingParams
from megatron_rl.rollout.episodes import run_episodes
from megatron_rl.rollout.groups import Group
from megatron_rl.scheduler.types import GroupSpec

log = logging.getLogger(__name__)


def stderr_of(values: list[float]) -> float:
    """Standard error of the mean of ``values`` (sample SD / sqrt(n)); nan below 2 values."""
    n = len(values)
    if n < 2:
        return math.nan
    mean = sum(values) / n
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n)


def paired_difference(before: list[float], after: list[float]) -> tuple[float, float]:
    """Mean of ``after - before`` over the same prompts, and its standard error."""
    if len(before) != len(after):
        raise ValueError(f"paired scores differ in length ({len(before)} vs {len(after)})")
    diffs = [a - b for a, b in zip(after, before, strict=True)]
    return sum(diffs) / max(1, len(diffs)), stderr_of(diffs)


def mean_stderr(stderrs: list[float]) -> float:
    """Standard error of a mean over domains whose estimates are independent."""
    if not stderrs:
        return math.nan
    return math.sqrt(sum(s * s for s in stderrs)) / len(stderrs)


@dataclass
class EvalResult:
    """Per-domain accuracy over distinct prompts, their per-prompt scores and standard errors."""

    accuracy: dict[str, float] = field(default_factory=dict)  # domain -> mean over prompts
    scores: dict[str, list[float]] = field(default_factory=dict)  # domain -> per-prompt scores
    levels: dict[str, list[int]] = field(default_factory=dict)  # domain -> level of each prompt
    stderr: dict[str, float] = field(default_factory=dict)  # domain -> SE over prompts (nan: <2)
    requested: int = 0  # distinct prompts asked for per domain
    samples_per_prompt: int = 1  # completions per prompt (a prompt scores their mean)
    temperature: float = 0.0  # sampling temperature (0: greedy)
    verifier_errors: int = 0  # verifications that raised (scored 0)
    records: list[tuple[Task, str, float]] = field(default_factory=list)  # (task, 1st response,
    # prompt score), one per prompt

    @property
    def distinct(self) -> dict[str, int]:
        return {k: len(v) for k, v in self.scores.items()}

    @property
    def mean(self) -> float:
        return sum(self.accuracy.values()) / max(1, len(self.accuracy))

    @property
    def top_answer_share(self) -> dict[str, float]:
        """Per domain, the share of prompts whose (first) answer is the domain's most common
        answer: 1.0 when the policy gives one answer to every prompt (a collapse to a constant)."""
        answers: dict[str, Counter[str]] = {}
        for task, text, _ in self.records:
            answers.setdefault(task.domain, Counter())[text.strip()] += 1
        return {d: c.most_common(1)[0][1] / sum(c.values()) for d, c in answers.items()}

    @property
    def mean_stderr(self) -> float:
        return mean_stderr(list(self.stderr.values()))

    def by_level(self, domain: str) -> dict[int, float]:
        """Accuracy per level of one domain's prompts."""
        out: dict[int, list[float]] = {}
        for lv, s in zip(self.levels[domain], self.scores[domain], strict=True):
            out.setdefault(lv, []).append(s)
        return {lv: sum(v) / len(v) for lv, v in sorted(out.items())}

    def metrics(self, prefix: str = "eval") -> dict[str, float]:
        """``<prefix>/<domain>/{accuracy,stderr,distinct,top_answer_share}``, per level where a
        domain has several (``<prefix>/<domain>/level<L>/accuracy``), ``<prefix>/mean_accuracy``,
        ``<prefix>/mean_stderr`` and ``<prefix>/verifier_errors``."""
        out: dict[str, float] = {}
        top = self.top_answer_share
        for k, acc in self.accuracy.items():
            out[f"{prefix}/{k}/accuracy"] = acc
            out[f"{prefix}/{k}/distinct"] = float(len(self.scores[k]))
            if k in top:
                out[f"{prefix}/{k}/top_answer_share"] = top[k]
            if math.isfinite(self.stderr[k]):
                out[f"{prefix}/{k}/stderr"] = self.stderr[k]
            levels = self.by_level(k)
            if len(levels) > 1:
                out.update({f"{prefix}/{k}/level{lv}/accuracy": a for lv, a in levels.items()})
        out[f"{prefix}/mean_accuracy"] = self.mean
        if math.isfinite(self.mean_stderr):
            out[f"{prefix}/mean_stderr"] = self.mean_stderr
        out[f"{prefix}/verifier_errors"] = float(self.verifier_errors)
        return out

    def to_json(self) -> dict[str, Any]:
        """What a checkpoint keeps of a sweep (enough to pair a later sweep with it)."""
        return {
            "accuracy": self.accuracy,
            "scores": self.scores,
            "levels": self.levels,
            "stderr": {k: _finite(v) for k, v in self.stderr.items()},
            "requested": self.requested,
            "top_answer_share": self.top_answer_share,
            "samples_per_prompt": self.samples_per_prompt,
            "temperature": self.temperature,
        }


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def safe_verify(domain: Domain, task: Task, response: str) -> VerifyResult | None:
    """``domain.verify`` that never raises: a failure (or a verdict whose verifier could not
    judge, ``VerifyResult.error``) is logged with its input, None returned."""
    try:
        result = domain.verify(task, response)
    except Exception as e:  # a broken verifier must not stop a run
        log.warning(
            "verifier of %s raised on task %s: %r (response %r)",
            domain.name,
            task.id,
            e,
            response[:200],
        )
        return None
    if isinstance(result, VerifyResult) and result.error:
        log.warning(
            "verifier of %s could not judge task %s: %s", domain.name, task.id, result.error
        )
        return None
    return result


def evaluate(
    engine: RolloutEngine,
    tokenizer: Any,
    domains: dict[str, Domain],
    n_per_domain: int,
    seed: int,
    max_tokens: int,
    level: int | None = None,
    stop: list[str] | None = None,
    *,
    samples: int = 1,
    temperature: float = 0.0,
    prompts: PromptSet | None = None,
    guard: DomainGuard | None = None,
) -> EvalResult:
    """Score up to ``n_per_domain`` distinct held-out prompts per domain, each once.

    ``prompts``: a prebuilt set (the RL loop builds one at start-up and reuses it, so the
    shortfall warning comes once); otherwise the eval split's set is built here. ``samples``
    completions per prompt at ``temperature`` (greedy: 0 and 1). Single-turn domains get one
    engine call for all their prompts; multi-turn domains (tool use) run their episodes with the
    environment, as in training, and are scored on the last model turn. ``stop``: the run's
    ``rollout.stop`` strings, as in training. ``guard``: the run's deadlined, counted domain
    calls (a failed verification scores 0 and counts in ``verifier_errors``); without it the
    verifiers run inline here.
    """
    if samples < 1:
        raise ValueError(f"samples per prompt must be >= 1, got {samples}")
    if temperature <= 0 and samples > 1:
        raise ValueError(f"{samples} samples per prompt need a temperature > 0 (greedy repeats)")
    if prompts is None:
        prompts = build_prompt_set(domains, n_per_domain, seed, level)
    tasks = [t for name in domains for t in prompts.tasks.get(name, [])]
    limit = guard.limit if guard is not None else None
    texts = _responses(
        engine, tokenizer, domains, tasks, seed, max_tokens, stop, samples, temperature, limit
    )
    result = EvalResult(
        requested=prompts.requested, samples_per_prompt=samples, temperature=temperature
    )
    for name in domains:  # a domain whose split gave no prompt at all is left out
        if prompts.tasks.get(name):
            result.scores[name], result.levels[name] = [], []
    if guard is not None:
        pairs = [(t, text) for t, outs in zip(tasks, texts, strict=True) for text in outs]
        flat = iter(guard.verify(pairs))
    for task, outs in zip(tasks, texts, strict=True):
        if guard is not None:
            verdicts = [next(flat) for _ in outs]
        else:
            verdicts = [safe_verify(domains[task.domain], task, text) for text in outs]
        result.verifier_errors += sum(v is None for v in verdicts)
        score = sum(v.score for v in verdicts if v is not None) / len(verdicts)
        result.scores[task.domain].append(score)
        result.levels[task.domain].append(task.level)
        result.records.append((task, outs[0], score))
    for name, s in result.scores.items():
        result.accuracy[name] = sum(s) / len(s)
        result.stderr[name] = stderr_of(s)
    return result


def _responses(
    engine: RolloutEngine,
    tokenizer: Any,
    domains: dict[str, Domain],
    tasks: list[Task],
    seed: int,
    max_tokens: int,
    stop: list[str] | None,
    samples: int,
    temperature: float,
    limit: int | None = None,
) -> list[list[str]]:
    """``samples`` responses to each task (the last model turn for multi-turn domains)."""
    single = [i for i, t in enumerate(tasks) if not domains[t.domain].multi_turn]
    multi = [i for i, t in enumerate(tasks) if domains[t.domain].multi_turn]
    texts: list[list[str]] = [[] for _ in tasks]

    def params(task: Task) -> SamplingParams:
        s = seed if temperature <= 0 else stable_int("eval", seed, task.id) % 2**31
        return SamplingParams(
            temperature=temperature, max_tokens=max_tokens, n=samples, seed=s, stop=list(stop or [])
        )

    requests = [
        GenRequest(prompt_ids(tokenizer, tasks[i].prompt), params(tasks[i]), tag=tasks[i].domain)
        for i in single
    ]
    # Prompts of similar length side by side: an engine batching in chunks pads each chunk to
    # its longest prompt, and hundreds of domains mix prompt lengths. Each prompt keeps its own
    # seed, so the order changes no sample beyond floating-point noise of the batched forward.
    order = sorted(range(len(requests)), key=lambda k: len(requests[k].prompt_ids))
    outs_sorted = engine.generate([requests[k] for k in order]) if requests else []
    outs_all: list[Any] = [None] * len(requests)
    for k, outs in zip(order, outs_sorted, strict=True):
        outs_all[k] = outs
    for i, outs in zip(single, outs_all, strict=True):
        texts[i] = [o.text for o in outs]
    if multi:
        groups = [
            Group(GroupSpec(tasks[i].domain, tasks[i].level, temperature), tasks[i]) for i in multi
        ]
        run_episodes(engine, tokenizer, domains, groups, samples, max_tokens, 1.0, stop, limit)
        for i, g in zip(multi, groups, strict=True):
            texts[i] = [s.text for s in g.samples]
    return texts
