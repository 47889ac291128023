"""A started run, as every part of it sees it: the config, this rank, the tokenizer, the tracker
and where the run resumes.

The loop (``train/runtime.py:setup_run``) starts the run and hands it to the controller and the
evaluation sweeps, which read it and never the trainer's half: the trainer's
:class:`~megatron_rl.train.runtime.Runtime` is a :class:`Run` that also holds the policy and its
checkpoints. So this module imports none of the controller, evaluation or train.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from megatron_rl.config import RunConfig
from megatron_rl.model.parallel import DistInfo
from megatron_rl.tracking.tracker import Tracker


@dataclass
class Run:
    """What the controller and the evaluation sweeps read of a started run."""

    cfg: RunConfig
    dist: DistInfo
    tokenizer: Any
    tracker: Tracker
    start_step: int  # first optimizer step to run (0 on a fresh run)
    resumed_state: dict[str, Any]  # trainer state saved by the loop ({} on a fresh run)

    @property
    def run_dir(self) -> Path:
        return self.cfg.run_dir

    @property
    def is_main(self) -> bool:
        return self.dist.rank == 0
