"""The controller's rollout engine: started on HF-layout weights, shut down with the run."""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from megatron_rl.rollout.base import RolloutEngine
from megatron_rl.rollout.build import build_engine
from megatron_rl.rollout.process_engine import oversubscribed, resolve
from megatron_rl.run import Run

log = logging.getLogger(__name__)


def start_engine(rt: Run, weights: Path) -> RolloutEngine:
    """Start the configured engine on HF-layout weights (the controller's, global rank 0 only)."""
    t0 = time.time()
    cfg = rt.cfg
    rollout = resolve(cfg.rollout, cfg.rl.off_policy, cfg.train.threads)
    if rollout.process == "own" and (warning := oversubscribed(cfg.train.threads, rollout.threads)):
        log.warning(warning)
    if cfg.rl.routing_replay == "rollout":  # the engine returns the experts it chose
        rollout = replace(rollout, return_routed_experts=True)
    engine = build_engine(rollout, str(weights), cfg.seed)
    log.info("rollout engine %r ready in %.1f s", cfg.rollout.engine, time.time() - t0)
    return engine


def finish(rt: Run, engine: RolloutEngine, summary: dict[str, Any]) -> dict[str, Any]:
    rt.tracker.finish()
    engine.shutdown()
    return summary
