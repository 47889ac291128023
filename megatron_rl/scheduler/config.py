"""Domain scheduler settings."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SchedulerConfig:
    """How the per-step task mix is chosen across domains."""

    policy: str = "uniform"  # registered mix policy: 'uniform', 'static', ...
    weights: dict[str, float] = field(default_factory=dict)  # static weights per domain/glob
    floor: float = 0.0  # minimum share of groups each domain keeps
    filter_zero_variance: bool = False  # drop groups whose rewards are all equal and refill
    oversample: float = 1.0  # factor of extra groups generated to refill filtered ones
