"""Which task domains a run uses, and how their code is kept from stopping it."""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class DomainsConfig:
    """Domains are selected by name or glob pattern from the entry-point registry.

    Start-up checks every selected domain and level on ``fit_samples`` prompts against the
    policy's context (prompt plus ``rollout.max_new_tokens``): one that cannot fit, or whose
    generator fails or stalls there, is left out with one line (``strict``: the run refuses,
    listing them all). During the run, domain code runs in ``workers`` processes under the
    deadlines below, and a domain failing too often is quarantined (megatron_rl/domains/health.py).
    """

    include: list[str] = field(default_factory=list)  # names or globs ('rg/*'); empty: none
    exclude: list[str] = field(default_factory=list)  # names or globs removed from include
    task_files: list[str] = field(default_factory=list)  # extra JSONL task sets (no code)
    level: int | None = None  # fixed difficulty level for all domains (None: scheduler decides)
    workers: int = 2  # processes running domain code under deadlines (0: inline, no deadlines)
    eval_failures: bool = True  # append held-out results below 1 to RUN_DIR/eval_failures.jsonl
    strict: bool = False  # refuse to start if any selected domain or level is unfit
    fit_samples: int = 8  # prompts per domain and level the start-up fit check tokenizes
    task_timeout_s: float = 10.0  # one task draw (all its candidate attempts)
    verify_timeout_s: float = 10.0  # one verification
    prompt_budget_s: float = 30.0  # one domain's eval prompt set: drawing stops after this
    max_failure_rate: float = 0.5  # quarantine a domain at this share of failed calls ...
    min_failures: int = 3  # ... once it has at least this many failures
    cache: str = "~/.cache/megatron-rl/prompt_sets"  # prompt sets by (domain, level, split,
    # seed, count, code version); "" turns the cache off

    def validate(self) -> None:
        if self.workers < 0:
            raise ValueError(f"domains.workers must be >= 0, got {self.workers}")
        if self.level is not None and self.level < 0:
            raise ValueError(f"domains.level must be >= 0 or null, got {self.level}")
        if self.fit_samples < 1:
            raise ValueError(f"domains.fit_samples must be >= 1, got {self.fit_samples}")
        for key in ("task_timeout_s", "verify_timeout_s", "prompt_budget_s"):
            v = getattr(self, key)
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"domains.{key} must be a positive number of seconds, got {v}")
        if not 0 < self.max_failure_rate <= 1:
            raise ValueError(
                f"domains.max_failure_rate must be in (0, 1], got {self.max_failure_rate}"
            )
        if self.min_failures < 1:
            raise ValueError(f"domains.min_failures must be >= 1, got {self.min_failures}")
