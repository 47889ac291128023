"""The step clock: wall time per phase of a step (generate, train, sync, eval, checkpoint)."""

from __future__ import annotations

import os
import time
from contextlib import contextmanager


class Timer:
    """Wall time per phase of a step; the remainder of the step is reported as 'other'.

    The RL loop starts a step's Timer where the previous step's metrics were taken, so that
    step's logging and checkpoint (which run after its row is written) count in the next row as
    ``time/log_s`` and ``time/checkpoint_s``: consecutive ``time/step_s`` add up to the loop's wall
    time, the way a trainer callback's step-end to step-end intervals do.
    """

    def __init__(self) -> None:
        self.start = time.time()
        self.start_cpu = time.process_time()
        self.spent: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str):
        t0 = time.time()
        try:
            yield
        finally:
            self.spent[name] = self.spent.get(name, 0.0) + time.time() - t0

    def metrics(self, step_metrics: dict[str, float]) -> dict[str, float]:
        total = time.time() - self.start
        out = {f"time/{k}_s": v for k, v in self.spent.items()}
        out["time/step_s"] = total
        out["time/step_cpu_s"] = time.process_time() - self.start_cpu  # this process, all threads
        out["time/other_s"] = max(0.0, total - sum(self.spent.values()))
        out["sys/load_avg_1m"] = os.getloadavg()[0]  # shared machines: timings need the load
        gen_tokens = step_metrics.get("rollout/response_len_mean", 0.0) * step_metrics.get(
            "rollout/samples", 0.0
        )
        if self.spent.get("generate"):
            out["perf/generated_tokens_per_s"] = gen_tokens / self.spent["generate"]
        return out
