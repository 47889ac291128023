"""Which task domains a run uses."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class DomainsConfig:
    """Domains are selected by name or glob pattern from the entry-point registry."""

    include: list[str] = field(default_factory=list)  # names or globs ('rg/*'); empty: none
    exclude: list[str] = field(default_factory=list)  # names or globs removed from include
    task_files: list[str] = field(default_factory=list)  # extra JSONL task sets (no code)
    level: int | None = None  # fixed difficulty level for all domains (None: scheduler decides)
    verify_workers: int = 0  # processes in the verifier pool (0: score inline)
    eval_failures: bool = True  # append held-out results below 1 to RUN_DIR/eval_failures.jsonl

    def validate(self) -> None:
        if self.verify_workers < 0:
            raise ValueError(f"domains.verify_workers must be >= 0, got {self.verify_workers}")
        if self.level is not None and self.level < 0:
            raise ValueError(f"domains.level must be >= 0 or null, got {self.level}")
