"""Experiment tracking settings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass
class TrackingConfig:
    """W&B plus a metrics.jsonl in the run directory (always written)."""

    wandb: Literal["auto", "online", "offline", "disabled"] = "auto"  # auto: online iff API key
    project: str = "megatron-rl"  # W&B project
    entity: str | None = None  # W&B entity (team)
    log_every: int = 1  # steps between metric logs
    domain_metrics_every: int = 1  # steps between the per-domain rows (sched/<domain>/...,
    # rollout/<domain>/..., monitor/<domain>/...); every sweep step has them too. Hundreds of
    # domains log thousands of keys a step: 10 keeps metrics.jsonl and W&B a tenth the size
    samples_per_log: int = 8  # trajectories in the W&B samples table per log
    progress: bool = True  # console progress bar

    def validate(self) -> None:
        for key in ("log_every", "domain_metrics_every"):
            if getattr(self, key) < 1:
                raise ValueError(f"tracking.{key} must be >= 1, got {getattr(self, key)}")
