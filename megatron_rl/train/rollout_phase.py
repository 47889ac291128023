"""Sample -> generate -> score: one step's groups, with every sample accounted for.

A *group* is one task sent ``n`` times to the engine (GRPO). Each completion becomes a
:class:`Sample` carrying its domain tag from the task through the reward to the metrics. Nothing
is dropped silently: truncated completions, verifier failures and unparsable answers are all
counted in :func:`rollout_metrics`; groups filtered later by the scheduler are counted there too.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from megatron_rl.domains import Domain, Task
from megatron_rl.domains.reward import compose_reward
from megatron_rl.model.tokenizer import prompt_ids
from megatron_rl.rollout.base import GenRequest, RolloutEngine, SamplingParams
from megatron_rl.scheduler import GroupResult, GroupSpec
from megatron_rl.train.episodes import run_episodes
from megatron_rl.train.evaluate import safe_verify

log = logging.getLogger(__name__)


@dataclass
class Sample:
    """One completion: the tokens the policy produced and what they earned."""

    domain: str
    prompt_ids: list[int]
    response_ids: list[int]  # generated tokens (incl. environment turns in episodes)
    rollout_logprobs: list[float]  # engine log-probs per response token (0 on env tokens)
    response_mask: list[float]  # 1 on policy tokens, 0 on environment tokens
    text: str
    finish_reason: str
    reward: float = 0.0
    score: float = 0.0
    parsable: bool = False
    verifier_error: bool = False


@dataclass
class Group:
    spec: GroupSpec
    task: Task
    samples: list[Sample] = field(default_factory=list)

    def result(self) -> GroupResult:
        return GroupResult(
            domain=self.spec.domain,
            level=self.spec.level,
            rewards=[s.reward for s in self.samples],
            response_lens=[len(s.response_ids) for s in self.samples],
            truncated=[s.finish_reason == "length" for s in self.samples],
        )


def make_tasks(
    specs: list[GroupSpec], domains: dict[str, Domain], cursor: dict[str, int], seed: int
) -> list[Task]:
    """The next training task of each planned group's domain (``cursor`` advances per domain)."""
    tasks = []
    for spec in specs:
        i = cursor.get(spec.domain, 0)
        cursor[spec.domain] = i + 1
        tasks.append(domains[spec.domain].task("train", i, spec.level, seed))
    return tasks


def generate(
    engine: RolloutEngine,
    tokenizer: Any,
    domains: dict[str, Domain],
    specs: list[GroupSpec],
    tasks: list[Task],
    n: int,
    max_tokens: int,
    top_p: float,
) -> list[Group]:
    """Send every single-turn group to the engine in one call; multi-turn ones run episodes."""
    groups = [Group(spec, task) for spec, task in zip(specs, tasks, strict=True)]
    single = [g for g in groups if not domains[g.spec.domain].multi_turn]
    multi = [g for g in groups if domains[g.spec.domain].multi_turn]
    requests = []
    for g in single:
        params = SamplingParams(
            temperature=g.spec.temperature, top_p=top_p, max_tokens=max_tokens, n=n
        )
        requests.append(GenRequest(prompt_ids(tokenizer, g.task.prompt), params, tag=g.spec.domain))
    outputs = engine.generate(requests) if requests else []
    for g, req, outs in zip(single, requests, outputs, strict=True):
        g.samples = [
            Sample(
                g.spec.domain,
                req.prompt_ids,
                list(c.token_ids),
                list(c.logprobs),
                [1.0] * len(c.token_ids),
                c.text,
                c.finish_reason,
            )
            for c in outs
        ]
    if multi:
        run_episodes(engine, tokenizer, domains, multi, n, max_tokens, top_p)
    return groups


def score(groups: list[Group], domains: dict[str, Domain], truncated_reward: float | None) -> float:
    """Verify every sample and set its reward; returns seconds spent. Never raises."""
    t0 = time.time()
    for g in groups:
        d = domains[g.spec.domain]
        for s in g.samples:
            verdict = safe_verify(d, g.task, s.text)
            if verdict is None:
                s.reward, s.verifier_error = 0.0, True
            else:
                s.reward, _ = compose_reward(verdict, s.text, d.reward_weights)
                s.score, s.parsable = verdict.score, verdict.parsable
            if s.finish_reason == "length" and truncated_reward is not None:
                s.reward = truncated_reward
    return time.time() - t0


def rollout_metrics(groups: list[Group], kept: list[int]) -> dict[str, float]:
    """Per-domain reward/accuracy and counts of every kind of sample (``rollout/...``)."""
    per: dict[str, list[Sample]] = defaultdict(list)
    for g in groups:
        per[g.spec.domain].extend(g.samples)
    out: dict[str, float] = {}
    for dom, samples in sorted(per.items()):
        out[f"rollout/{dom}/reward_mean"] = sum(s.reward for s in samples) / len(samples)
        out[f"rollout/{dom}/accuracy"] = sum(s.score >= 1.0 for s in samples) / len(samples)
    everything = [s for g in groups for s in g.samples]
    out["rollout/samples"] = len(everything)
    out["rollout/samples_trained"] = sum(len(groups[i].samples) for i in kept)
    out["rollout/groups_filtered"] = len(groups) - len(kept)
    out["rollout/truncated"] = sum(s.finish_reason == "length" for s in everything)
    out["rollout/unparsable"] = sum(not s.parsable for s in everything)
    out["rollout/verifier_errors"] = sum(s.verifier_error for s in everything)
    out["rollout/reward_mean"] = sum(s.reward for s in everything) / max(1, len(everything))
    out["rollout/response_len_mean"] = sum(len(s.response_ids) for s in everything) / max(
        1, len(everything)
    )
    return out
