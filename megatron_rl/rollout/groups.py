"""Sample and Group: one completion and the task it answers, from generation to advantages.

A *group* is one task sent n times to the engine (GRPO). Each completion becomes a
:class:`Sample` carrying its domain tag from the task through the reward to the metrics. This
module imports none of the modules that build or read them (the episodes beside it, the
controller's generation and batches, evaluation), so each of those can import it; it sits in
``rollout/``, below both evaluation and the controller, which fill groups alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from megatron_rl.domains import Task
from megatron_rl.scheduler import GroupResult, GroupSpec


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
    violations: tuple[str, ...] = ()  # constraints the verifier found broken
    verifier_reward: float = 0.0  # the verifier's composed terms (a model reward may replace them)
    routed_experts: Any = None  # MoE: the engine's experts per token [P + R - 1, L, k], or None


@dataclass
class Group:
    spec: GroupSpec
    task: Task
    samples: list[Sample] = field(default_factory=list)
    failed: str = ""  # why the group is dropped (its domain's code failed, prompt too long)

    def result(self, advantage: str = "grpo") -> GroupResult:
        """What the scheduler sees of this group (``advantage``: the loop's estimator).

        ``entropy`` is the mean of -log p over the group's policy tokens, with the engine's
        log-probs at the sampling temperature: a Monte-Carlo estimate of the per-token entropy
        of the distribution sampled from (what ``temperature_adapt: entropy`` steers).
        """
        rewards = [s.reward for s in self.samples]
        return GroupResult(
            domain=self.spec.domain,
            level=self.spec.level,
            rewards=rewards,
            response_lens=[len(s.response_ids) for s in self.samples],
            truncated=[s.finish_reason == "length" for s in self.samples],
            entropy=self.entropy(),
            no_signal=all(r == 0 for r in rewards) if advantage == "passthrough" else None,
            heated=self.spec.heated,
        )

    def entropy(self) -> float | None:
        """Mean -log p of the sampled policy tokens (nats/token); None without any."""
        total, count = 0.0, 0.0
        for s in self.samples:
            for lp, m in zip(s.rollout_logprobs, s.response_mask, strict=False):
                total -= lp * m
                count += m
        return total / count if count else None
