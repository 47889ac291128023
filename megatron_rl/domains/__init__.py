"""Task domains: the API the RL loop consumes (tasks + verifiers), discovered via entry points.

    from megatron_rl.domains import load_domains
    domains = load_domains(include=["rg/basic_arithmetic@*", "math/*"])
    d = domains["math/linear_equation"]
    task = d.task("train", index=0, level=1, seed=0)
    result = d.verify(task, "<answer>3/2</answer>")  # never raises

See docs/domains.md.
"""

from megatron_rl.domains import sizes
from megatron_rl.domains.base import (
    Domain,
    Env,
    Observation,
    RewardWeights,
    Task,
    VerifyResult,
    extract_answer,
    split_of,
)
from megatron_rl.domains.loading import load_domains
from megatron_rl.domains.registry import PluginError, registry
from megatron_rl.domains.reward import compose_reward

__all__ = [
    "Domain",
    "Env",
    "Observation",
    "PluginError",
    "RewardWeights",
    "Task",
    "VerifyResult",
    "compose_reward",
    "extract_answer",
    "load_domains",
    "registry",
    "sizes",
    "split_of",
]
