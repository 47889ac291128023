"""Reward composition and sandbox settings."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class RewardsConfig:
    """How verifier results become scalar rewards."""

    format_weight: float = 0.0  # weight of the format score added to the outcome score
    length_penalty: float = 0.0  # penalty per token over rewards.length_target (0: off)
    length_target: int = 0  # response length beyond which the penalty applies, tokens
    truncated_reward: float | None = None  # reward for truncated responses (None: score as is)
    sandbox_timeout_s: float = 10.0  # wall-time limit per code execution
    sandbox_memory_mb: int = 512  # memory limit per code execution
    sandbox_workers: int = 0  # parallel sandbox executions (0: number of cores)
    allow_unsandboxed: bool = False  # run code without isolation (loudly logged; never default)
