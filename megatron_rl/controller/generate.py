"""Sample -> generate -> score: one step's groups, with every sample accounted for.

Nothing is dropped silently: truncated completions, verifier failures and unparsable answers are
all counted in :func:`rollout_metrics`; groups filtered later by the scheduler are counted there
too. Domain code runs through the run's :class:`~megatron_rl.domains.guard.DomainGuard`: a task
draw or verification that fails or passes its deadline, or a prompt too long for the policy,
drops that group alone (``rollout/groups_dropped``, ``health/<domain>/<kind>``), and a domain
that keeps failing is quarantined. The groups themselves are :mod:`megatron_rl.rollout.groups`.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from megatron_rl.domains import Domain, Task
from megatron_rl.domains.guard import DomainGuard
from megatron_rl.domains.reward import compose_reward
from megatron_rl.evaluation.evaluate import safe_verify
from megatron_rl.model.tokenizer import prompt_ids
from megatron_rl.rewards.constraints import Multipliers
from megatron_rl.rewards.judge import Judge
from megatron_rl.rewards.reward_model import RewardModel
from megatron_rl.rollout.base import GenRequest, RolloutEngine, SamplingParams
from megatron_rl.rollout.episodes import run_episodes
from megatron_rl.rollout.groups import Group, Sample
from megatron_rl.scheduler import GroupSpec

if TYPE_CHECKING:
    from megatron_rl.config import RunConfig

log = logging.getLogger(__name__)
Scorer = Judge | RewardModel  # model-based rewards (megatron_rl/rewards/)


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
    stop: list[str] | None = None,
    guard: DomainGuard | None = None,
) -> list[Group]:
    """Send every single-turn group to the engine in one call; multi-turn ones run episodes.
    With ``guard``, a prompt too long for the policy is not sent: its group is marked failed."""
    groups = [Group(spec, task) for spec, task in zip(specs, tasks, strict=True)]
    single, requests = [], []
    for g in groups:
        ids = prompt_ids(tokenizer, g.task.prompt)
        if guard is not None and not guard.fits(g.spec.domain, len(ids)):
            g.failed = "too_long"
            continue
        if domains[g.spec.domain].multi_turn:
            continue
        params = SamplingParams(
            temperature=g.spec.temperature,
            top_p=top_p,
            max_tokens=max_tokens,
            n=n,
            stop=list(stop or []),
        )
        single.append(g)
        requests.append(GenRequest(ids, params, tag=g.spec.domain))
    multi = [g for g in groups if domains[g.spec.domain].multi_turn and not g.failed]
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
                routed_experts=c.routed_experts,
            )
            for c in outs
        ]
    if multi:
        limit = guard.limit if guard is not None else None
        run_episodes(engine, tokenizer, domains, multi, n, max_tokens, top_p, stop, limit)
    return groups


def score(
    groups: list[Group],
    domains: dict[str, Domain],
    truncated_reward: float | None,
    guard: DomainGuard | None = None,
    floor: bool | float = True,
    prices: Multipliers | None = None,
    scorers: list[Scorer] | None = None,
) -> float:
    """Verify every sample and set its reward; returns seconds spent. Never raises: a group
    with a failed verification is marked failed (dropped), its domain's failure counted.
    Without ``guard`` the verifiers run inline here (tests, tools). ``floor``: a hard violation
    gets the domain's floor (True), this value in every domain (a number) or no floor (False);
    ``prices``: the constraints' multipliers, each violation's price taken off the reward;
    ``scorers``: the model-based rewards (the judge, the reward model), each adding its weighted
    score on the domains it scores (a sample one cannot score drops its group, counted under
    ``<judge|reward_model>/failures/*``)."""
    t0 = time.time()
    live = [g for g in groups if not g.failed]
    pairs = [(g.task, s.text) for g in live for s in g.samples]
    if guard is not None:
        verdicts = iter(guard.verify(pairs))
    else:
        verdicts = iter([safe_verify(domains[t.domain], t, text) for t, text in pairs])
    for g in live:
        d = domains[g.spec.domain]
        weights = d.reward_weights
        if not isinstance(floor, bool):
            weights = replace(weights, hard_floor=float(floor))
        for s in g.samples:
            verdict = next(verdicts)
            if verdict is None:
                s.reward, s.verifier_error = 0.0, True
                g.failed = "verify"
            else:
                s.reward, _ = compose_reward(verdict, s.text, weights, floor is not False)
                s.verifier_reward = s.reward
                s.score, s.parsable = verdict.score, verdict.parsable
                s.violations = verdict.violations
                if prices is not None and s.violations:
                    s.reward -= prices.penalty(s.violations)
            if s.finish_reason == "length" and truncated_reward is not None:
                s.reward = truncated_reward
    for sc in scorers or []:
        add_verdicts(sc, [g for g in live if not g.failed and sc.applies(g.spec.domain)])
    return time.time() - t0


def add_verdicts(scorer: Scorer, groups: list[Group]) -> None:
    """One batched call of a model-based scorer for the groups' samples; a sample it could not
    score drops its group (never a silent 0)."""
    pairs = [(g, s) for g in groups for s in g.samples]
    verdicts = scorer.score([(g.task, s.text) for g, s in pairs])
    for (g, s), v in zip(pairs, verdicts, strict=True):
        if isinstance(v, str):
            g.failed = scorer.prefix
        elif scorer.cfg.replace:  # the model's score instead of the verifier's terms
            s.reward += scorer.cfg.weight * v - s.verifier_reward
        else:
            s.reward += scorer.cfg.weight * v


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
    out["rollout/groups_generated"] = len(groups)
    out["rollout/groups_trained"] = len(kept)
    out["rollout/groups_trained_with_signal"] = sum(
        len({s.reward for s in groups[i].samples}) > 1 for i in kept
    )
    out["rollout/groups_filtered"] = len(groups) - len(kept)
    out["rollout/truncated"] = sum(s.finish_reason == "length" for s in everything)
    out["rollout/unparsable"] = sum(not s.parsable for s in everything)
    out["rollout/verifier_errors"] = sum(s.verifier_error for s in everything)
    out["rollout/reward_mean"] = sum(s.reward for s in everything) / max(1, len(everything))
    out["rollout/response_len_mean"] = sum(len(s.response_ids) for s in everything) / max(
        1, len(everything)
    )
    return out


def has_signal(g: Group, advantage: str) -> bool:
    """A scored group the zero-variance filter keeps (for GRPO: rewards not all equal)."""
    return not g.failed and not g.result(advantage).filterable


class RolloutProducer:
    """Plans, generates and scores a step's groups; optionally one step ahead (off-policy).

    On-policy (``rl.off_policy: false``): ``get(step)`` does everything for ``step`` now, with
    the engine holding the weights of the last sync. Off-policy: ``get(step)`` also starts step
    ``step + 1`` in a background thread, so generation overlaps training; ``wait()`` (called
    before each weight sync) lets it finish first, so the engine is never updated mid-batch.
    Samples are then exactly one policy version behind the trainer (staleness 1, logged as
    ``rollout/staleness``; truncated importance sampling corrects for it). Planning happens on
    the caller's thread, so the scheduler and task cursors are never touched concurrently.
    """

    def __init__(
        self,
        engine: RolloutEngine,
        tokenizer: Any,
        domains: dict[str, Domain],
        sched: Any,
        cursor: dict[str, int],
        cfg: RunConfig,
        guard: DomainGuard,
        version: int = 0,
        prices: Multipliers | None = None,
        scorers: list[Scorer] | None = None,
    ) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self.engine, self.tokenizer, self.domains = engine, tokenizer, domains
        self.sched, self.cursor, self.cfg, self.guard = sched, cursor, cfg, guard
        self.version = version  # optimizer steps in the engine's weights (resume: start step)
        self.prices = prices  # the constraints' multipliers (rewards.constraints), or None
        self.scorers = scorers or []  # model-based rewards: rewards.judge, rewards.reward_model
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="rollout")
        self._next: Any = None  # (step, future) of the prefetched step

    def _plan(self, step: int) -> tuple[list[GroupSpec], list[Task], int]:
        """The step's groups and their tasks; a group whose task draw failed is left out (the
        count of those is the third value)."""
        specs = self.sched.plan(step, self.cfg.rl.prompts_per_step)
        wanted = []
        for spec in specs:  # the cursor advances on a failed draw too (a resume draws the same)
            i = self.cursor.get(spec.domain, 0)
            self.cursor[spec.domain] = i + 1
            wanted.append((spec.domain, i, spec.level))
        tasks = self.guard.tasks(wanted, self.cfg.seed)
        kept = [(sp, t) for sp, t in zip(specs, tasks, strict=True) if t is not None]
        return [sp for sp, _ in kept], [t for _, t in kept], len(specs) - len(kept)

    def _collect(
        self, specs: list[GroupSpec], tasks: list[Task], undrawn: int, version: int
    ) -> tuple[list[Group], dict[str, float]]:
        t0 = time.time()
        cfg = self.cfg
        groups = generate(
            self.engine,
            self.tokenizer,
            self.domains,
            specs,
            tasks,
            cfg.rl.group_size,
            cfg.rollout.max_new_tokens,
            cfg.rollout.top_p,
            cfg.rollout.stop,
            self.guard,
        )
        t1 = time.time()
        r = cfg.rewards
        floor: bool | float = r.violation_floor
        if floor and r.violation_floor_value is not None:
            floor = r.violation_floor_value
        score(
            groups, self.domains, r.truncated_reward, self.guard, floor, self.prices, self.scorers
        )
        timing = {"generate": t1 - t0, "score": time.time() - t1, "undrawn": float(undrawn)}
        return groups, {**timing, "version": version}

    def get(self, step: int) -> tuple[list[Group], dict[str, float]]:
        """The scored groups of ``step`` and their timings (seconds) and staleness.

        Staleness: optimizer steps the trainer has taken (``step``) minus those in the weights
        the engine sampled with; 0 on-policy with a sync every step.
        """
        if self._next is not None and self._next[0] == step:
            groups, timing = self._next[1].result()
            self._next = None
        else:
            groups, timing = self._collect(*self._plan(step), self.version)
        if self.cfg.scheduler.dynamic_sampling:
            groups, timing = self._more_rounds(step, groups, timing)
        timing["staleness"] = step - timing.pop("version")
        if self.cfg.rl.off_policy and step + 1 < self.cfg.train.steps:
            plan = self._plan(step + 1)
            self._next = (step + 1, self._pool.submit(self._collect, *plan, self.version))
        return groups, timing

    def _more_rounds(
        self, step: int, groups: list[Group], timing: dict[str, float]
    ) -> tuple[list[Group], dict[str, float]]:
        """Dynamic sampling: further rounds of planned groups until the step holds
        ``dynamic_target`` groups with reward variance or ``dynamic_max_rounds`` rounds ran."""
        s = self.cfg.scheduler
        target = s.dynamic_target or self.cfg.rl.prompts_per_step
        rounds = 1
        advantage = self.cfg.rl.advantage
        while (
            sum(has_signal(g, advantage) for g in groups) < target and rounds < s.dynamic_max_rounds
        ):
            more, t = self._collect(*self._plan(step), self.version)
            groups = groups + more
            for k in ("generate", "score", "undrawn"):
                timing[k] += t[k]
            rounds += 1
        timing["rounds"] = float(rounds)
        return groups, timing

    def wait(self) -> None:
        """Block until a prefetched step has finished generating (before a weight sync)."""
        if self._next is not None:
            self._next[1].result()

    def synced(self, optimizer_steps: int) -> None:
        """The engine now holds the trainer's weights after ``optimizer_steps`` steps."""
        self.version = optimizer_steps

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
