"""Slurm launch settings (``RunConfig.slurm``): the layout of a job and the site's knobs.

Two layouts, one script (``slurm/job.sbatch.j2``, rendered by ``megatron-rl submit``):

* ``nodes == 1``: colocated. Rollout servers and the trainer share the node; the servers take
  the last ``servers * gpus_per_server`` GPUs, the trainer the rest.
* ``nodes > 1``: disaggregated. The first ``nodes - rollout_nodes`` nodes train (Megatron through
  ``srun`` + ``torchrun``), the last ``rollout_nodes`` run ``servers()`` rollout servers
  each; the router runs on the first rollout node. All are job steps of one allocation.

Site-specific knobs (partition, account, container image, network interface...) are documented
in docs/slurm.md. Sizes that cannot fit the allocation raise ``ValueError`` at submit time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from megatron_rl.slurm.values import check_strings


@dataclass
class SlurmConfig:
    """How ``megatron-rl submit`` lays a run out on a Slurm allocation."""

    nodes: int = 1  # nodes in the allocation (--nodes on the command line overrides)
    rollout_nodes: int = 0  # nodes running rollout servers when nodes > 1 (0: half, rounded up)
    gpus_per_node: int = 8  # GPUs per node requested (--gpus-per-node); 0 on CPU clusters
    servers_per_node: int = 0  # rollout servers per rollout node (0: fill it; colocated: half)
    gpus_per_server: int = 1  # GPUs per rollout server (its tensor-parallel size); 0 on CPU
    server_engine: Literal["sglang", "vllm", "hf"] = "sglang"  # sglang on GPUs, else embedded
    server_model: str = ""  # HF model the servers start from ('' -> model.hf_path)
    router_port: int = 30000  # sglang-router port on the first rollout node
    time_limit: str = "04:00:00"  # --time, [days-]hours:minutes:seconds (sbatch's formats)
    partition: str = ""  # --partition, a name or a comma list ('' -> the cluster's default)
    account: str = ""  # --account ('' -> the user's default)
    qos: str = ""  # --qos ('' -> default)
    cpus_per_node: int = 0  # --cpus-per-task of the one task per node (0: Slurm's default)
    mem: str = ""  # --mem per node, e.g. '512G' ('' -> Slurm's default; '0' = all)
    container_image: str = ""  # pyxis/enroot image for every srun step ('' -> no container)
    container_mounts: str = ""  # pyxis --container-mounts, e.g. '/data:/data'
    network_interface: str = ""  # NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME ('' -> auto)
    setup: list[str] = field(default_factory=list)  # shell lines run first, verbatim, one each
    cli: str = "megatron-rl"  # how to run the CLI on the nodes (e.g. /shared/venv/bin/megatron-rl)
    train_command: str = ""  # trainer command ('' -> '<cli> train CONFIG'); test hook for fakes
    signal_before_end_s: int = 300  # seconds before the time limit that USR1 asks for a checkpoint
    requeue: bool = True  # requeue after that signal (and allow Slurm to requeue on preemption)
    health_timeout_s: int = 900  # seconds a server may take to become healthy before failing
    trainer_procs_per_node: int = 0  # trainer ranks per trainer node (0: its GPUs; CPU: 1)
    extra_sbatch: list[str] = field(default_factory=list)  # more '#SBATCH' lines ('--exclusive')

    def layout(self) -> tuple[int, int]:
        """(trainer nodes, rollout nodes); both 1 and shared when ``nodes == 1``."""
        if self.nodes == 1:
            return 1, 1
        rollout = self.rollout_nodes or (self.nodes + 1) // 2
        return self.nodes - rollout, rollout

    def servers(self) -> int:
        """Rollout servers per rollout node: ``servers_per_node``, or by default as many as
        fit (disaggregated) or half the node's GPUs (colocated); 1 on CPU nodes."""
        if self.servers_per_node:
            return self.servers_per_node
        if not self.gpus_per_server or not self.gpus_per_node:
            return 1
        gpus = self.gpus_per_node // 2 if self.nodes == 1 else self.gpus_per_node
        return max(1, gpus // self.gpus_per_server)

    def trainer_gpus(self) -> int:
        """GPUs per trainer node (what is left beside the servers when colocated)."""
        if self.nodes == 1:
            return self.gpus_per_node - self.servers() * self.gpus_per_server
        return self.gpus_per_node

    def trainer_procs(self) -> int:
        """Trainer ranks per trainer node: ``trainer_procs_per_node``, else one per GPU."""
        return self.trainer_procs_per_node or max(1, self.trainer_gpus())

    def validate(self) -> None:
        if self.nodes < 1:
            raise ValueError(f"slurm.nodes must be >= 1, got {self.nodes}")
        if self.nodes > 1 and not 0 <= self.rollout_nodes < self.nodes:
            raise ValueError(
                f"slurm.rollout_nodes={self.rollout_nodes} must leave at least one of the "
                f"{self.nodes} nodes to the trainer (0 picks half)"
            )
        for key in (
            "servers_per_node",
            "gpus_per_node",
            "gpus_per_server",
            "cpus_per_node",
            "signal_before_end_s",
            "trainer_procs_per_node",
        ):
            if getattr(self, key) < 0:
                raise ValueError(f"slurm.{key} must be >= 0, got {getattr(self, key)}")
        need = self.servers() * self.gpus_per_server
        if need > self.gpus_per_node:
            raise ValueError(
                f"slurm: {self.servers()} servers x {self.gpus_per_server} GPUs = {need} "
                f"GPUs per node, more than slurm.gpus_per_node={self.gpus_per_node}"
            )
        if self.nodes == 1 and self.gpus_per_node and self.trainer_gpus() < 1:
            raise ValueError(
                f"slurm: on one node the servers take all {self.gpus_per_node} GPUs and leave "
                "none to the trainer; lower servers_per_node or gpus_per_server, or use nodes > 1"
            )
        if self.server_engine == "sglang" and self.gpus_per_server < 1:
            raise ValueError("slurm.server_engine=sglang needs gpus_per_server >= 1")
        check_strings(self)  # one line each; sbatch's formats on #SBATCH lines
        if not 0 < self.router_port < 65536:
            raise ValueError(f"slurm.router_port must be in 1..65535, got {self.router_port}")
