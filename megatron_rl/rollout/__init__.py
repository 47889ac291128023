"""Rollout: engines that sample completions with log-probs, and trainer -> engine weight sync.

``base`` holds the interface and registry (``build_engine``); engines live in ``hf_engine``
(transformers reference), ``vllm_engine`` (embedded vLLM) and ``sglang_client`` (remote SGLang).
Engine modules are imported on first ``build_engine`` call, so importing this package is cheap.
On top of the engines: ``episodes`` runs multi-turn episodes (the model acts, a domain's
environment answers) and fills the :class:`~.groups.Group` and :class:`~.groups.Sample` of
``groups``, for the controller and evaluation alike.
"""

from typing import Any

from megatron_rl.rollout.base import (
    ENGINES,
    Completion,
    EngineStartError,
    GenRequest,
    RolloutEngine,
    SamplingParams,
    register_engine,
)
from megatron_rl.rollout.build import build_engine


def __getattr__(name: str) -> Any:  # sync_weights imports torch: only when asked for
    if name == "sync_weights":
        from megatron_rl.rollout.weight_sync import sync_weights

        return sync_weights
    raise AttributeError(name)


__all__ = [
    "ENGINES",
    "Completion",
    "EngineStartError",
    "GenRequest",
    "RolloutEngine",
    "SamplingParams",
    "build_engine",
    "register_engine",
    "sync_weights",
]
