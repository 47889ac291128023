"""Start the configured rollout engine, in this process or in a child process of its own.

The registry and the interface are :mod:`megatron_rl.rollout.base`; the child-process wrapper is
:mod:`megatron_rl.rollout.process_engine`, whose child starts its engine with
``base.engine_class`` (so neither of those two modules imports this one).
"""

from __future__ import annotations

from megatron_rl.rollout.base import RolloutEngine, engine_class
from megatron_rl.rollout.config import RolloutConfig
from megatron_rl.rollout.process_engine import ProcessEngine


def build_engine(cfg: RolloutConfig, model_dir: str, seed: int) -> RolloutEngine:
    """Start the engine named by ``cfg.engine`` on the HF-layout model in ``model_dir``; with
    ``cfg.process == "own"`` in a child process (``process_engine.ProcessEngine``, its torch
    threads ``cfg.threads`` or 1)."""
    cls = engine_class(cfg)
    if cfg.process == "own" and cfg.engine != "sglang":  # the same engine, in a child process
        return ProcessEngine(cfg, model_dir, seed, cfg.threads or 1)
    return cls(cfg, model_dir, seed)  # type: ignore[call-arg]
