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
    samples_per_log: int = 8  # trajectories in the W&B samples table per log
    progress: bool = True  # console progress bar
