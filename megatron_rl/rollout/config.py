"""Rollout engine settings."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass
class RolloutConfig:
    """Which engine generates completions, and how."""

    engine: str = "hf"  # registered engine name: 'hf' (transformers), 'vllm', 'sglang'
    max_new_tokens: int = 64  # response length cap, tokens
    temperature: float = 1.0  # default sampling temperature (the scheduler may set per domain)
    top_p: float = 1.0  # nucleus sampling
    stop: list[str] = field(default_factory=list)  # stop strings
    sync_every: int = 1  # optimizer steps between weight syncs trainer -> engine
    sync_dir: str | None = None  # where HF-layout weights are written for disk sync (None: run dir)
    dtype: Literal["float32", "bfloat16"] = "float32"  # engine compute dtype
    max_batch: int = 256  # most sequences the engine decodes at once
    kv_cache_gb: float = 2.0  # vLLM CPU KV cache size (VLLM_CPU_KVCACHE_SPACE)
    urls: list[str] = field(default_factory=list)  # router/server URLs for remote engines
    request_timeout_s: float = 300.0  # per HTTP request, remote engines

    def validate(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"rollout.max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"rollout.temperature must be >= 0, got {self.temperature}")
        if not (0 < self.top_p <= 1):
            raise ValueError(f"rollout.top_p must be in (0, 1], got {self.top_p}")
        if self.sync_every < 1:
            raise ValueError(f"rollout.sync_every must be >= 1, got {self.sync_every}")
