"""Domain scheduler: dynamic mix, per-domain temperature, curriculum, zero-variance filter with
refill and the seesaw guard. See ``docs/scheduler.md`` and :mod:`.scheduler`."""

from megatron_rl.scheduler.config import SchedulerConfig
from megatron_rl.scheduler.policies import POLICIES
from megatron_rl.scheduler.scheduler import DomainScheduler
from megatron_rl.scheduler.types import DomainInfo, GroupResult, GroupSpec

__all__ = [
    "POLICIES",
    "DomainInfo",
    "DomainScheduler",
    "GroupResult",
    "GroupSpec",
    "SchedulerConfig",
]
