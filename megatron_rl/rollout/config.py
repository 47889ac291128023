"""Rollout engine settings."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass
class SGLangConfig:
    """The SGLang client (engine 'sglang'): talks to the router or server at rollout.urls[0]."""

    max_concurrency: int = 256  # most HTTP requests in flight at once (one per sample)
    max_retries: int = 8  # attempts after the first for a failed request (dead server, 5xx)
    retry_backoff_s: float = 0.2  # first back-off before a retry, seconds; doubles each attempt
    retry_max_backoff_s: float = 5.0  # back-off cap, seconds
    connect_timeout_s: float = 10.0  # TCP connect timeout per request, seconds
    health_timeout_s: float = 60.0  # how long to wait for the router to report a healthy worker
    weight_sync: Literal["disk", "distributed"] = "disk"  # safetensors on shared disk, or NCCL
    bucket_mb: int = 512  # distributed sync: tensors per broadcast bucket, MiB
    master_addr: str = ""  # distributed sync: address of trainer rank 0 ('' -> this host)
    master_port: int = 29600  # distributed sync: TCP port of the weight-update process group
    engine_tp: int = 0  # distributed sync: ranks per server (0: slurm.gpus_per_server, else 1)
    group_timeout_s: float = 120.0  # distributed sync: group rendezvous timeout, seconds
    bucket_timeout_s: float = 60.0  # distributed sync: most seconds one bucket's broadcast may
    # take (both ends); a server that died or never joined costs this, then a rebuild
    group_retries: int = 3  # distributed sync: rebuilds of a group that failed to form
    record_weights: bool = True  # distributed sync: also write each version to sync_dir, so a
    # restarted server loads it before it takes traffic (written in the background)
    deterministic: bool = False  # servers honour each sample's sampling_seed (SGLang's
    # --enable-deterministic-inference, slower on GPUs); off: each server's own seeded stream
    router_policy: Literal["cache_aware", "round_robin", "power_of_two", "random"] = (
        "cache_aware"  # sglang-router --policy (docs/serving.md has the measurement)
    )
    api_key_file: str = ""  # file with the fleet's API key, sent as a Bearer token ('':
    # $MEGATRON_RL_API_KEY, else <run dir>/api_key when the fleet made one; rollout/auth.py)
    health_check_timeout_s: float = 300.0  # how long a health check may wait for a server
    # (router and SGLANG_HEALTH_CHECK_TIMEOUT): longer than the longest weight update, which
    # holds the server's update lock that the one-token check waits on

    def validate(self) -> None:
        if self.max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {self.max_concurrency}")
        if self.max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {self.max_retries}")
        if self.retry_backoff_s < 0 or self.retry_max_backoff_s < self.retry_backoff_s:
            raise ValueError("need 0 <= retry_backoff_s <= retry_max_backoff_s")
        if self.bucket_mb < 1:
            raise ValueError(f"bucket_mb must be >= 1, got {self.bucket_mb}")
        if self.engine_tp < 0 or self.group_retries < 0 or self.group_timeout_s <= 0:
            raise ValueError(
                "rollout.sglang.engine_tp and group_retries must be >= 0, group_timeout_s > 0"
            )
        for key in ("bucket_timeout_s", "health_check_timeout_s", "connect_timeout_s"):
            if getattr(self, key) <= 0:
                raise ValueError(f"rollout.sglang.{key} must be > 0, got {getattr(self, key)}")

    def ranks_per_server(self) -> int:
        """Ranks one server holds in the weight-update group (engine_tp, 1 when unset)."""
        return self.engine_tp or 1


@dataclass
class RolloutConfig:
    """Which engine generates completions, and how."""

    engine: str = "hf"  # registered engine name: 'hf' (transformers), 'vllm', 'sglang'
    process: Literal["auto", "same", "own"] = "auto"  # where an embedded engine (hf, vllm) runs:
    # 'same' (the trainer's process), 'own' (a child process, rollout/process_engine.py),
    # 'auto' ('own' with rl.off_policy, so generation overlaps training; else 'same')
    threads: int = 0  # torch CPU threads of an engine in its own process (0: the cores that
    # train.threads leaves, at least 1)
    max_new_tokens: int = 64  # response length cap, tokens
    top_p: float = 1.0  # nucleus sampling
    stop: list[str] = field(default_factory=list)  # stop strings (besides the EOS token)
    sync_every: int = 1  # optimizer steps between weight syncs trainer -> engine
    sync_dir: str | None = None  # where HF-layout weights are written for disk sync (None: run dir)
    sync_mode: Literal["disk", "memory"] = "disk"  # embedded engines: safetensors file or tensors
    dtype: Literal["float32", "bfloat16"] = "float32"  # engine compute dtype
    max_batch: int = 256  # most sequences the engine decodes at once
    kv_cache_gb: float = 2.0  # vLLM CPU KV cache size (VLLM_CPU_KVCACHE_SPACE), GiB (whole)
    block_size: int | None = 32  # vLLM KV block, tokens; prefixes are shared in whole blocks
    # (CPU: a multiple of 32, vLLM's CPU default 128 shares nothing for prompts < 128 tokens)
    gpu_memory_utilization: float = 0.5  # vLLM on GPU: fraction of GPU memory it may take
    urls: list[str] = field(default_factory=list)  # router/server URLs for remote engines
    request_timeout_s: float = 300.0  # per HTTP request, remote engines
    return_routed_experts: bool = False  # MoE: record the experts chosen for every token (the
    # RL loop turns it on for rl.routing_replay=rollout; SGLang's --enable-return-routed-experts)
    sglang: SGLangConfig = field(default_factory=SGLangConfig)  # remote SGLang client

    def validate(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"rollout.max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not (0 < self.top_p <= 1):
            raise ValueError(f"rollout.top_p must be in (0, 1], got {self.top_p}")
        if not (0 < self.gpu_memory_utilization <= 1):
            raise ValueError(
                f"rollout.gpu_memory_utilization must be in (0, 1], "
                f"got {self.gpu_memory_utilization}"
            )
        if self.block_size is not None and self.block_size < 1:
            raise ValueError(f"rollout.block_size must be >= 1 or null, got {self.block_size}")
        if self.process not in ("auto", "same", "own"):
            raise ValueError(f"rollout.process must be auto, same or own, got {self.process!r}")
        if self.threads < 0:
            raise ValueError(f"rollout.threads must be >= 0, got {self.threads}")
        if self.sync_every < 1:
            raise ValueError(f"rollout.sync_every must be >= 1, got {self.sync_every}")
        if self.sglang.weight_sync == "distributed" and self.sync_mode != "memory":
            raise ValueError(
                "rollout.sglang.weight_sync=distributed needs rollout.sync_mode=memory "
                f"(got rollout.sync_mode={self.sync_mode}, which writes files instead)"
            )
