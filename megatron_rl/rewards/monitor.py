"""Reward-hacking monitor: flags reward that rises for the wrong reasons.

Two signals, tracked per domain, each giving a metric every step and, when it turns on, a
logged sample for a person to inspect (``RewardHackingMonitor.samples``, and a WARNING log line):

* **Reward jump without eval rise.** The mean training reward of the last ``window`` steps is
  compared with the ``window`` steps before. A rise of at least ``jump_threshold`` counts as a
  jump unless held-out eval accuracy (``observe_eval``) rose by at least ``eval_ratio`` times the
  jump over the same two windows. No eval over that span means the jump is unexplained and is
  flagged. A policy that learned the task gains on held-out tasks too; one that found a
  verifier loophole usually does not.
* **Identical answers across different tasks.** In one batch, answers are normalised
  (whitespace collapsed) and grouped; if one answer is given for at least ``cluster_min_tasks``
  distinct tasks making up at least ``cluster_frac`` of the batch's tasks, it is flagged.
  Identical answers within one task's group are normal and ignored, as are answers shorter than
  ``min_answer_chars`` (many tasks legitimately share "0" or "yes").
* **Model reward kept while the verifier's falls.** Where a learned reward model or a judge
  scores a domain, the controller also passes each sample's verifier reward (``verified``). Over
  the last ``divergence_window`` steps against the as many before, a fall of the mean verifier
  reward by at least ``divergence_threshold`` while the mean reward fell by less than half as
  much (or rose) is flagged: the policy is pleasing the scorer and getting the task wrong. It
  needs no eval, so it can fire between sweeps. (A first rule asked the reward to *rise* by the
  threshold; the policies that collapsed against the study's reward models mostly did so with
  the reward flat, and it missed three of four: docs/rewards.md.)

Metric keys: ``monitor/<domain>/reward_mean``, ``reward_jump``, ``eval_delta``,
``reward_jump_warning`` (0/1), ``answer_cluster_frac``, ``answer_cluster_warning`` (0/1); with
``verified``: ``verified_mean``, ``verified_change``, ``divergence_warning`` (0/1).
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections import defaultdict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from statistics import fmean

from megatron_rl.rewards.config import RewardsConfig

log = logging.getLogger(__name__)
SAMPLE_ANSWER_CHARS = 500  # characters of each answer kept in a logged sample
MAX_SAMPLES = 200  # logged samples kept in memory (oldest dropped)


@dataclass
class _DomainState:
    rewards: deque = field(default_factory=deque)  # (step, batch mean reward), oldest first
    scored: deque = field(default_factory=deque)  # (step, reward mean, verifier reward mean)
    evals: list[tuple[int, float]] = field(default_factory=list)  # (step, accuracy)
    jump_on: bool = False  # the reward-jump warning was on at the last step
    cluster_on: bool = False  # the answer-cluster warning was on at the last step
    divergence_on: bool = False  # the divergence warning was on at the last step


class RewardHackingMonitor:
    """Per-domain reward-jump and answer-cluster detection; see the module docstring."""

    def __init__(
        self,
        window: int = 20,
        jump_threshold: float = 0.25,
        eval_ratio: float = 0.5,
        cluster_min_tasks: int = 3,
        cluster_frac: float = 0.3,
        min_answer_chars: int = 20,
        divergence_threshold: float = 0.05,
        divergence_window: int = 5,
    ) -> None:
        if window < 1 or cluster_min_tasks < 2 or not 0 < cluster_frac <= 1:
            raise ValueError("window must be >= 1, cluster_min_tasks >= 2, 0 < cluster_frac <= 1")
        if not divergence_threshold > 0 or divergence_window < 1:
            raise ValueError(
                f"divergence_threshold must be > 0 and divergence_window >= 1, got "
                f"{divergence_threshold}, {divergence_window}"
            )
        self.divergence_threshold, self.divergence_window = divergence_threshold, divergence_window
        self.window, self.jump_threshold, self.eval_ratio = window, jump_threshold, eval_ratio
        self.cluster_min_tasks, self.cluster_frac = cluster_min_tasks, cluster_frac
        self.min_answer_chars = min_answer_chars
        self.samples: deque[dict] = deque(maxlen=MAX_SAMPLES)  # logged samples, newest last
        self.n_warnings = 0  # every warning ever raised (``samples`` keeps the newest only)
        self._domains: dict[str, _DomainState] = defaultdict(_DomainState)

    @classmethod
    def from_config(cls, cfg: RewardsConfig) -> RewardHackingMonitor:
        return cls(
            window=cfg.monitor_window,
            jump_threshold=cfg.monitor_jump_threshold,
            eval_ratio=cfg.monitor_eval_ratio,
            cluster_min_tasks=cfg.monitor_cluster_min_tasks,
            cluster_frac=cfg.monitor_cluster_frac,
            min_answer_chars=cfg.monitor_min_answer_chars,
            divergence_threshold=cfg.monitor_divergence_threshold,
            divergence_window=cfg.monitor_divergence_window,
        )

    def observe_eval(self, step: int, domain: str, acc: float) -> None:
        """Record held-out eval accuracy of ``domain`` at ``step``."""
        self._domains[domain].evals.append((step, float(acc)))

    def observe(
        self,
        step: int,
        domain: str,
        rewards: Sequence[float],
        answers: Sequence[str],
        task_ids: Sequence[object],
        verified: Sequence[float] | None = None,
    ) -> dict[str, float]:
        """Record one step's scored samples of ``domain`` (sequences of equal length
        [num_samples]; ``verified``: the verifier's reward of each sample where a model reward
        scores the domain) and return this step's ``monitor/<domain>/...`` metrics."""
        if not len(rewards) == len(answers) == len(task_ids):
            raise ValueError(
                f"rewards, answers and task_ids must have equal lengths, got "
                f"{len(rewards)}, {len(answers)}, {len(task_ids)}"
            )
        if verified is not None and len(verified) != len(rewards):
            raise ValueError(f"verified has {len(verified)} values for {len(rewards)} rewards")
        state = self._domains[domain]
        rewards = [float(r) for r in rewards]
        if rewards:
            state.rewards.append((step, fmean(rewards)))
            while len(state.rewards) > 2 * self.window:
                state.rewards.popleft()
        jump, eval_delta = self._jump(state)
        prefix = f"monitor/{domain}"
        out: dict[str, float] = {}
        if verified is not None:
            out = self._divergence(state, step, domain, rewards, list(verified), answers, task_ids)
        jump_on = jump >= self.jump_threshold and not eval_delta >= self.eval_ratio * jump
        frac, cluster = self._cluster(answers, task_ids)
        cluster_on = cluster is not None
        if jump_on and not state.jump_on:
            detail = f"reward rose {jump:+.3f} over {self.window} steps; eval {eval_delta:+.3f}"
            self._log(step, domain, "reward_jump", detail, rewards, answers, task_ids, None)
        if cluster is not None and not state.cluster_on:
            detail = f"one answer given for {frac:.0%} of the batch's distinct tasks"
            self._log(step, domain, "answer_cluster", detail, rewards, answers, task_ids, cluster)
        state.jump_on, state.cluster_on = jump_on, cluster_on
        return out | {
            f"{prefix}/reward_mean": fmean(rewards) if rewards else math.nan,
            f"{prefix}/reward_jump": jump,
            f"{prefix}/eval_delta": eval_delta,
            f"{prefix}/reward_jump_warning": float(jump_on),
            f"{prefix}/answer_cluster_frac": frac,
            f"{prefix}/answer_cluster_warning": float(cluster_on),
        }

    def _divergence(
        self,
        state: _DomainState,
        step: int,
        domain: str,
        rewards: list[float],
        verified: list[float],
        answers: Sequence[str],
        task_ids: Sequence[object],
    ) -> dict[str, float]:
        """The reward's and the verifier's change over the same two windows; flagged when the
        verifier's reward fell by the threshold while the reward fell by less than half as much."""
        w = self.divergence_window
        if verified:
            state.scored.append((step, fmean(rewards), fmean(float(v) for v in verified)))
            while len(state.scored) > 2 * w:
                state.scored.popleft()
        rise = change = 0.0
        if len(state.scored) == 2 * w:
            _, r, v = zip(*state.scored, strict=True)
            rise = fmean(r[w:]) - fmean(r[:w])
            change = fmean(v[w:]) - fmean(v[:w])
        t = self.divergence_threshold
        on = change <= -t and rise > change / 2
        if on and not state.divergence_on:
            detail = f"reward {rise:+.3f} while the verifier's {change:+.3f} over {w} steps"
            self._log(step, domain, "reward_divergence", detail, rewards, answers, task_ids, None)
        state.divergence_on = on
        prefix = f"monitor/{domain}"
        return {
            f"{prefix}/verified_mean": state.scored[-1][2] if state.scored else math.nan,
            f"{prefix}/verified_change": change,
            f"{prefix}/divergence_warning": float(on),
        }

    def _jump(self, state: _DomainState) -> tuple[float, float]:
        """(recent window mean - previous window mean, eval change over both windows).

        The eval baseline is the last eval at or before the previous window's first step (or the
        first one inside it); the current value is the last eval inside the recent window.
        """
        if len(state.rewards) < 2 * self.window:
            return 0.0, math.nan
        history = list(state.rewards)
        before, recent = history[: self.window], history[self.window :]
        jump = fmean(r for _, r in recent) - fmean(r for _, r in before)
        first, last, end = before[0][0], before[-1][0], recent[-1][0]
        baseline = [a for s, a in state.evals if s <= first] or [
            a for s, a in state.evals if s <= last
        ][:1]
        current = [a for s, a in state.evals if last < s <= end]
        eval_delta = current[-1] - baseline[-1] if baseline and current else math.nan
        return jump, eval_delta

    def _cluster(
        self, answers: Sequence[str], task_ids: Sequence[object]
    ) -> tuple[float, str | None]:
        """(share of the batch's tasks covered by the biggest cross-task answer, that answer)."""
        tasks_by_answer: dict[str, set] = defaultdict(set)
        for answer, task in zip(answers, task_ids, strict=True):
            key = re.sub(r"\s+", " ", str(answer)).strip()
            if len(key) >= self.min_answer_chars:
                tasks_by_answer[key].add(task)
        n_tasks = len(set(task_ids))
        if not tasks_by_answer or n_tasks == 0:
            return 0.0, None
        answer, tasks = max(tasks_by_answer.items(), key=lambda kv: len(kv[1]))
        frac = len(tasks) / n_tasks
        hit = len(tasks) >= self.cluster_min_tasks and frac >= self.cluster_frac
        return frac, answer if hit else None

    def _log(
        self,
        step: int,
        domain: str,
        kind: str,
        detail: str,
        rewards: Sequence[float],
        answers: Sequence[str],
        task_ids: Sequence[object],
        cluster: str | None,
    ) -> None:
        picks = [
            i
            for i, a in enumerate(answers)
            if cluster is None or re.sub(r"\s+", " ", str(a)).strip() == cluster
        ][:5]
        if cluster is None:
            picks = sorted(range(len(rewards)), key=lambda i: -rewards[i])[:5]
        sample = {
            "step": step,
            "domain": domain,
            "kind": kind,
            "detail": detail,
            "examples": [
                {
                    "task_id": str(task_ids[i]),
                    "reward": rewards[i],
                    "answer": str(answers[i])[:SAMPLE_ANSWER_CHARS],
                }
                for i in picks
            ],
        }
        self.samples.append(sample)
        self.n_warnings += 1
        log.warning(
            "possible reward hacking in %s at step %d: %s", domain, step, json.dumps(sample)
        )
