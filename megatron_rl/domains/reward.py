"""Reward composition: outcome score + process scores - format and length penalties.

Each domain carries a :class:`~megatron_rl.domains.base.RewardWeights` (the domain API's data
types live in ``base.py``, so this module imports it and not the other way round);
:func:`compose_reward` turns a verifier verdict into the scalar the advantage estimator sees::

    reward = outcome * score
           + sum(process[k] * process_scores[k])
           - format_penalty * (answer not parsable)
           - length_penalty * max(0, len(response) - length_budget_chars) / 1000

A verdict with ``hard_violation`` (safety: complied with a request that must be refused) gets
``hard_floor`` regardless of everything else: the trainer can treat it as a penalty floor that
no amount of formatting or process credit can buy back.
"""

from __future__ import annotations

from megatron_rl.domains.base import RewardWeights, VerifyResult


def compose_reward(
    result: VerifyResult, response: str, weights: RewardWeights, floor: bool = True
) -> tuple[float, dict[str, float]]:
    """The scalar reward and its terms (namespaced for metrics) for one verified response.
    ``floor``: a hard violation gets ``hard_floor`` (off: the terms as for any response, and a
    Lagrange multiplier prices the violation, megatron_rl/rewards/constraints.py)."""
    if result.hard_violation and floor:
        return weights.hard_floor, {"reward/hard_violation": 1.0}
    terms = {"reward/outcome": weights.outcome * result.score}
    for name, w in weights.process.items():
        terms[f"reward/process/{name}"] = w * result.process_scores.get(name, 0.0)
    if weights.format_penalty and not result.parsable:
        terms["reward/format_penalty"] = -weights.format_penalty
    over = max(0, len(response) - weights.length_budget_chars)
    if weights.length_penalty and over:
        terms["reward/length_penalty"] = -weights.length_penalty * over / 1000
    return sum(terms.values()), terms
