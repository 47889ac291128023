"""What each rollout server of a fleet is started with: its GPUs, its seed, its flags, its env.

* **GPUs.** ``CUDA_VISIBLE_DEVICES`` of a Slurm step holds the devices that step may use, as
  Slurm wrote them (global ids without device cgroups, ``0..k-1`` with them, or UUIDs). A fleet
  picks its servers' devices *from that list*: ``gpu_indices`` are positions in it, never
  device ids, so a colocated job that gives the servers "the last four GPUs" gets the last four
  the step sees, whatever their ids (:func:`step_gpus`).
* **Seeds.** SGLang applies a request's ``sampling_seed`` only in deterministic mode; otherwise
  a server samples from its own ``--random-seed`` stream. Servers started with the same seed
  behind a round-robin router would draw correlated samples for one GRPO group, so every server
  of a job gets its own seed, as slime gives every engine its own (:func:`server_seed`).
* **Health.** SGLang's ``/health`` is a one-token generation behind the update lock; a weight
  update holds that lock for its whole length. The servers get ``SGLANG_HEALTH_CHECK_TIMEOUT``
  and the router ``--health-check-timeout-secs`` longer than the longest update, so a check
  that collides with one waits for it instead of failing (:func:`router_cmd`).
"""

from __future__ import annotations

import os
import socket
import sys
from typing import Any

SEED_STRIDE_RESTART = 7919  # a restarted server's seed moves by this, so it does not replay


def visible_gpus() -> list[str]:
    """The devices this process may use, as ``CUDA_VISIBLE_DEVICES`` spells them.

    Without that variable, Slurm's ``SLURM_STEP_GPUS`` / ``SLURM_JOB_GPUS`` (global ids) are
    used only if the process sees more devices than the step holds (no device cgroup: global
    ids are CUDA ordinals); with a device cgroup the step's devices are ordinals ``0..k-1``.
    """
    value = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    if value:
        return [x.strip() for x in value.split(",") if x.strip()]
    for var in ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS"):
        ids = [x.strip() for x in os.environ.get(var, "").split(",") if x.strip()]
        if ids:
            return ids if _device_count() > len(ids) else [str(i) for i in range(len(ids))]
    return []


def _device_count() -> int:
    try:
        import torch

        return int(torch.cuda.device_count())
    except Exception:  # no torch or no driver: treat the step's devices as all there is
        return 0


def step_gpus(gpu_indices: list[int] | None) -> list[str]:
    """The visible devices at ``gpu_indices`` (all when None); ValueError for a position the
    step does not have. Without any visible-device variable the positions are the ordinals."""
    have = visible_gpus()
    if gpu_indices is None:
        return have
    if not have:
        return [str(i) for i in gpu_indices]
    bad = [i for i in gpu_indices if not 0 <= i < len(have)]
    if bad:
        raise ValueError(
            f"--gpu-ids {bad} are positions among the step's visible GPUs {have} "
            f"(CUDA_VISIBLE_DEVICES), which has {len(have)}; use 0..{len(have) - 1}"
        )
    return [have[i] for i in gpu_indices]


def assign_gpus(
    num_servers: int, gpus_per_server: int, gpu_indices: list[int] | None = None
) -> list[list[str]]:
    """Devices for each server (from :func:`step_gpus`); ValueError when too few."""
    if gpus_per_server == 0:
        return [[] for _ in range(num_servers)]
    have = step_gpus(gpu_indices)
    need = num_servers * gpus_per_server
    if need > len(have):
        raise ValueError(
            f"{num_servers} servers x {gpus_per_server} GPUs = {need} GPUs requested on "
            f"{socket.gethostname()}, but the allocation has {len(have)} ({have}); lower "
            "slurm.servers_per_node or slurm.gpus_per_server, or ask Slurm for more GPUs"
        )
    return [have[i * gpus_per_server : (i + 1) * gpus_per_server] for i in range(num_servers)]


def server_seed(base: int, node_index: int, per_node: int, local: int, restarts: int = 0) -> int:
    """A seed no other server of the job has: one per (rollout node, server), moved on restart."""
    return base + node_index * per_node + local + SEED_STRIDE_RESTART * restarts


def sglang_server_args(rollout: Any, routed_experts: bool = False) -> list[str]:
    """``sglang.launch_server`` flags from the run's ``rollout`` section, built one by one (the
    seed is per server: :func:`server_seed`).

    Never ``--config <run yaml>``: SGLang's own ``--config`` turns every YAML key into a flag,
    and ``run_name:``/``model:`` are not SGLang flags. ``routed_experts`` (routing replay) adds
    ``--enable-return-routed-experts`` (SGLang's ``server_args.py``).
    """
    args = ["--dtype", rollout.dtype]
    args += ["--mem-fraction-static", str(rollout.gpu_memory_utilization)]
    args += ["--max-running-requests", str(rollout.max_batch)]
    if rollout.sglang.deterministic:
        args.append("--enable-deterministic-inference")
    if routed_experts:
        args.append("--enable-return-routed-experts")
    return args


def server_env(health_check_timeout_s: float) -> dict[str, str]:
    """Environment of every server: the health-check wait and contained NCCL faults (a broken
    weight-update broadcast answers an error instead of killing the server)."""
    return {
        "SGLANG_HEALTH_CHECK_TIMEOUT": str(int(health_check_timeout_s)),
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "2",
    }


def router_cmd(
    host: str,
    port: int,
    metrics_port: int,
    policy: str,
    health_check_timeout_s: float,
    startup_timeout_s: float,
    api_key: str,
) -> list[str]:
    """sglang-router with our retries off (the client counts its own) and health checks that
    outwait a weight update: a check times out only after ``health_check_timeout_s`` (the
    servers answer within it once the update lock is free), three misses in a row mark a
    worker unhealthy, checks every 5 s, one success makes it healthy again.

    ``--api-key``: the router then refuses ``/generate``, ``/workers`` and the other routes
    without ``Authorization: Bearer <key>`` (401; only ``/health``, ``/liveness`` and the info
    routes stay open, measured against sglang-router 0.3.2 in tests/integration/
    test_fleet_auth.py) and sends the same key to the workers."""
    return [
        *[sys.executable, "-m", "sglang_router.launch_router", "--host", host],
        *["--api-key", api_key],
        *["--port", str(port), "--prometheus-port", str(metrics_port)],
        *["--prometheus-host", host],  # its metrics listen where it does, not on 0.0.0.0
        *["--policy", policy, "--disable-retries"],
        *["--health-check-interval-secs", "5", "--health-failure-threshold", "3"],
        *["--health-success-threshold", "1"],
        *["--health-check-timeout-secs", str(int(health_check_timeout_s) + 10)],
        *["--worker-startup-timeout-secs", str(int(startup_timeout_s))],
        *["--shutdown-grace-period-secs", "2", "--log-level", "warn"],
    ]
