"""The ``eval`` section: held-out sweeps, the training-prompt sample and the level sweeps
(``megatron_rl/evaluation/``, which reads the whole run config and so does not hold it).

These were the ``rl.eval_*`` keys until issue 36 (``rl.eval_every`` is ``eval.every`` now); the
root config (:data:`megatron_rl.config.RENAMED`) still loads the old keys, with one warning each.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class EvalConfig:
    """What the RL loop scores, how, and how often (``megatron_rl/evaluation/sweeps.py``)."""

    every: int = 10  # optimizer steps between held-out sweeps (0: only before and after the run)
    samples_per_domain: int = 64  # distinct held-out prompts per domain per sweep, each once
    samples_per_prompt: int = 1  # completions per eval prompt; a prompt scores their mean
    temperature: float = 0.0  # sampling temperature (0: greedy; > 0: sampled pass@1)
    greedy_also: bool = False  # sampled eval: also score the prompts greedily (eval_greedy/*)
    train_prompts: int = -1  # distinct training prompts per domain scored at the start and the
    # end (eval_train/*, the memorisation gap); -1: as many as samples_per_domain, 0: none
    # difficulty levels of a before/after held-out sweep per level (evaluation/levels.py; for
    # long-context domains: accuracy against context length); empty: none
    levels: list[int] = field(default_factory=list)
    samples_per_level: int = 128  # distinct held-out prompts per domain per level of it

    def validate(self) -> None:
        if self.samples_per_domain < 1:
            raise ValueError(f"eval.samples_per_domain must be >= 1, got {self.samples_per_domain}")
        if self.samples_per_prompt < 1:
            raise ValueError(f"eval.samples_per_prompt must be >= 1, got {self.samples_per_prompt}")
        if not (math.isfinite(self.temperature) and 0 <= self.temperature <= 2):
            raise ValueError(f"eval.temperature must be in [0, 2], got {self.temperature}")
        if self.temperature == 0 and self.samples_per_prompt > 1:
            raise ValueError(
                f"eval.samples_per_prompt={self.samples_per_prompt} needs "
                "eval.temperature > 0 (greedy decoding gives the same answer every time)"
            )
        if self.train_prompts < -1:
            raise ValueError(
                f"eval.train_prompts must be -1 (as eval.samples_per_domain), 0 (off) or a "
                f"count, got {self.train_prompts}"
            )
        if self.levels and self.samples_per_level < 1:
            raise ValueError(
                f"eval.samples_per_level must be >= 1 with eval.levels set, "
                f"got {self.samples_per_level}"
            )
