"""Slurm preemption: a signal flag, and steps too long for the grace between signal and kill."""

from __future__ import annotations

import logging
import signal
from typing import Any

from megatron_rl.config.train import CheckpointConfig

log = logging.getLogger(__name__)


class PreemptionFlag:
    """Set by SIGTERM / SIGUSR1 (what Slurm sends before the time limit or on preemption)."""

    def __init__(self) -> None:
        self.requested = False
        for sig in (signal.SIGTERM, signal.SIGUSR1):
            try:
                signal.signal(sig, self._handle)
            except ValueError:  # not the main thread (e.g. under a test runner thread)
                pass

    def _handle(self, signum: int, frame: Any) -> None:
        log.warning("received signal %d: will checkpoint after this step", signum)
        self.requested = True


GRACE_SHARE = 0.75  # a step plus its checkpoint must fit in this share of the grace period


_warned_grace: set[int] = set()


def outlasts_grace(ckpt: CheckpointConfig, step_s: float, ckpt_s: float, step: int) -> bool:
    """This step plus a checkpoint takes longer than ``checkpoint.preempt_grace_s`` allows:
    a signal in the next step could not be answered with a checkpoint before the kill."""
    grace = ckpt.preempt_grace_s
    if not grace or step_s + ckpt_s <= GRACE_SHARE * grace:
        return False
    if not _warned_grace:
        log.warning(
            "step %d took %.1f s (+ %.1f s checkpoint), more than %.0f%% of "
            "checkpoint.preempt_grace_s=%.0f: checkpointing every step while that lasts",
            step,
            step_s,
            ckpt_s,
            100 * GRACE_SHARE,
            grace,
        )
        _warned_grace.add(step)
    return True
