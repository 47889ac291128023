"""Process groups for the policy: torch.distributed + Megatron model-parallel state.

``init_distributed`` works in three situations with the same call:

* a plain single process (tests, notebooks, ``megatron-rl sft`` on a laptop): no ``RANK`` /
  ``WORLD_SIZE`` in the environment, so we start a world of 1 on a free loopback port;
* under ``torchrun`` (or Slurm's ``srun`` exporting the same variables): the usual env:// init;
* a second call in the same process: returns the existing layout (idempotent).

The layout is validated once, at start-up and before any process group exists, by
:func:`validate_layout` (``train/preflight.py`` for a run, ``megatron-rl submit`` for a job's
trainer world), with one ``ValueError`` line naming what is wrong and what is allowed (TP must
divide the heads, PP the layers, ...), so a bad config never surfaces as a traceback from inside
megatron-core; :func:`init_distributed` takes a layout that passed it. Data parallelism takes
whatever is left: ``dp = world / (tp * pp * cp)``; a mixture-of-experts model's experts are split
on their own grid over the same processes (``ep`` x ``etp`` per PP stage, replicated over what is
left).
On CPU the backend is gloo and the compat layer is applied.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from megatron_rl.model import compat
from megatron_rl.model.config import ModelConfig, ParallelConfig


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits in the (tp, cp, dp, pp) grid."""

    rank: int  # global rank
    world_size: int  # number of processes
    tp: int  # tensor-parallel size
    pp: int  # pipeline-parallel size
    cp: int  # context-parallel size
    dp: int  # data-parallel size
    tp_rank: int
    pp_rank: int
    cp_rank: int
    dp_rank: int
    device: torch.device  # cuda:<local rank> or cpu
    backend: str  # nccl or gloo
    ep: int = 1  # expert-parallel size
    ep_rank: int = 0
    etp: int = 1  # tensor-parallel size inside an expert (1 or tp)
    edp_rank: int = 0  # rank among the replicas of this rank's experts

    def shard(self) -> dict[str, int]:
        """This rank's coordinates as ``convert.hf_to_megatron_rank`` takes them."""
        return dict(
            tp=self.tp,
            tp_rank=self.tp_rank,
            pp=self.pp,
            pp_rank=self.pp_rank,
            ep=self.ep,
            ep_rank=self.ep_rank,
            etp=self.etp,
        )

    @property
    def is_first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def is_last_stage(self) -> bool:
        return self.pp_rank == self.pp - 1


_info: dict[str, DistInfo] = {}
_control: dict[str, object] = {}  # the CPU (gloo) control-plane group, see control_group()
CONTROL_TIMEOUT = timedelta(hours=6)  # longest a rank waits on the controller (rollout + eval)


def have_transformer_engine() -> bool:
    """True when Transformer Engine imports (needed for CP on GPU and the THD packed layout)."""
    try:
        import transformer_engine  # noqa: F401
    except Exception:
        return False
    return True


def use_te_spec() -> bool:
    """TE layer spec only with CUDA and Transformer Engine; the local spec everywhere else."""
    return torch.cuda.is_available() and have_transformer_engine()


def validate_layout(
    parallel: ParallelConfig, world_size: int, model: ModelConfig | None, gpu: bool | None = None
) -> None:
    """Raise one clear ValueError if ``parallel`` cannot be laid out on ``world_size`` processes.

    ``gpu``: whether the ranks will have CUDA (None: this process's, Transformer Engine checked
    too); ``megatron-rl submit`` checks a GPU job's layout from a login node without one."""
    parallel.validate()
    here = gpu is None  # checking this process's own environment (Transformer Engine too)
    gpu = torch.cuda.is_available() if gpu is None else gpu
    tp, pp, cp, dp = parallel.tp, parallel.pp, parallel.cp, parallel.dp
    if dp and dp * tp * pp * cp != world_size:
        raise ValueError(
            f"parallel.dp * parallel.tp * parallel.pp * parallel.cp = {dp} * {tp} * {pp} * {cp} "
            f"= {dp * tp * pp * cp} is not the world size {world_size}; "
            "set parallel.dp=0 (derived) or sizes whose product is the world size"
        )
    if world_size % (tp * pp * cp):
        raise ValueError(
            f"world size {world_size} is not divisible by parallel.tp * parallel.pp * parallel.cp "
            f"= {tp} * {pp} * {cp} = {tp * pp * cp}; choose sizes whose product divides it"
        )
    if cp > 1 and gpu and here and not have_transformer_engine():
        raise ValueError(
            f"parallel.cp={cp} on GPU needs Transformer Engine (its attention is the GPU CP path), "
            "which does not import here; install transformer_engine or use parallel.cp=1"
        )
    if cp > 1 and pp > 1 and not gpu:
        raise ValueError(
            f"parallel.cp={cp} with parallel.pp={pp} is not supported on CPU "
            "(context parallelism runs with parallel.pp=1); set parallel.pp=1 or parallel.cp=1"
        )
    if model is None:
        return
    if model.num_attention_heads % tp:
        raise ValueError(
            f"parallel.tp={tp} must divide model.num_attention_heads={model.num_attention_heads}"
        )
    if model.num_query_groups % tp:
        raise ValueError(
            f"parallel.tp={tp} must divide model.num_query_groups={model.num_query_groups}"
        )
    if model.num_layers % pp:
        raise ValueError(f"parallel.pp={pp} must divide model.num_layers={model.num_layers}")
    _validate_experts(parallel, world_size, model)
    if pp > 1 and model.tie_embeddings and not gpu:
        raise ValueError(
            "model.tie_embeddings=true with parallel.pp>1 is GPU-only (megatron-core moves the "
            "shared weight with .cuda()); use parallel.pp=1 or untied embeddings on CPU"
        )


def _validate_experts(parallel: ParallelConfig, world_size: int, model: ModelConfig) -> None:
    ep, etp, pp = parallel.ep, parallel.expert_tp, parallel.pp
    if not model.is_moe:
        if ep > 1:
            raise ValueError(
                f"parallel.ep={ep} needs a mixture-of-experts model; model.arch="
                f"{model.arch} is dense, use parallel.ep=1"
            )
        return
    if model.moe.num_experts % ep:
        raise ValueError(
            f"parallel.ep={ep} must divide model.moe.num_experts={model.moe.num_experts}"
        )
    if world_size % (ep * etp * pp):
        raise ValueError(
            f"world size {world_size} is not divisible by parallel.ep * etp * pp = "
            f"{ep} * {etp} * {pp} = {ep * etp * pp}; choose sizes whose product "
            "divides it"
        )
    if model.moe.ffn_hidden_size % etp:
        raise ValueError(
            f"the expert tensor-parallel degree {etp} (parallel.etp) must divide "
            f"model.moe.ffn_hidden_size={model.moe.ffn_hidden_size}"
        )
    if parallel.cp > 1:
        raise ValueError(
            f"parallel.cp={parallel.cp} with a mixture-of-experts model is not "
            "supported yet; use parallel.cp=1"
        )
    if model.moe.dispatcher == "allgather" and pp > 1:
        raise ValueError(
            "model.moe.dispatcher=allgather does not take variable sequence "
            f"lengths, which parallel.pp={pp} needs; use alltoall"
        )


def _init_process_group(backend: str) -> None:
    if dist.is_initialized():
        return
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        # A single process needs no rendezvous: an in-memory store avoids picking a TCP port
        # (a free port can be taken by another process between the check and the bind).
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    else:
        dist.init_process_group(backend)


def init_distributed(parallel: ParallelConfig, seed: int) -> DistInfo:
    """Initialise torch.distributed and Megatron's parallel state; idempotent.

    ``parallel`` must fit the world and the model (:func:`validate_layout`, run at start-up).
    """
    from megatron.core import parallel_state as mpu
    from megatron.core import tensor_parallel

    if "info" in _info and not (dist.is_initialized() and mpu.model_parallel_is_initialized()):
        # someone else tore the process group down (e.g. an in-process vLLM engine's shutdown)
        _info.pop("info")
        _control.pop("group", None)
        if mpu.model_parallel_is_initialized():
            mpu.destroy_model_parallel()
    if "info" in _info:
        info = _info["info"]
        have = (info.tp, info.pp, info.cp, info.ep, info.etp)
        if have != (parallel.tp, parallel.pp, parallel.cp, parallel.ep, parallel.expert_tp):
            raise ValueError(
                f"distributed state already initialised with tp={info.tp} pp={info.pp} "
                f"cp={info.cp} ep={info.ep} etp={info.etp}; call destroy_distributed() before "
                f"asking for tp={parallel.tp} pp={parallel.pp} cp={parallel.cp} ep={parallel.ep} "
                f"etp={parallel.expert_tp}"
            )
        return info
    cuda = torch.cuda.is_available()
    backend = parallel.backend if parallel.backend != "auto" else ("nccl" if cuda else "gloo")
    if cuda:
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        compat.apply()
        device = torch.device("cpu")
    _init_process_group(backend)
    mpu.initialize_model_parallel(
        tensor_model_parallel_size=parallel.tp,
        pipeline_model_parallel_size=parallel.pp,
        context_parallel_size=parallel.cp,
        expert_model_parallel_size=parallel.ep,
        expert_tensor_parallel_size=parallel.expert_tp,
    )
    tensor_parallel.model_parallel_cuda_manual_seed(seed, inference_rng_tracker=not cuda)
    torch.manual_seed(seed)
    info = DistInfo(
        rank=dist.get_rank(),
        world_size=dist.get_world_size(),
        tp=parallel.tp,
        pp=parallel.pp,
        cp=parallel.cp,
        dp=mpu.get_data_parallel_world_size(),
        tp_rank=mpu.get_tensor_model_parallel_rank(),
        pp_rank=mpu.get_pipeline_model_parallel_rank(),
        cp_rank=mpu.get_context_parallel_rank(),
        dp_rank=mpu.get_data_parallel_rank(),
        device=device,
        backend=backend,
        ep=parallel.ep,
        ep_rank=mpu.get_expert_model_parallel_rank(),
        etp=parallel.expert_tp,
        edp_rank=mpu.get_expert_data_parallel_rank(),
    )
    # The controller's evals and rollouts can keep trainer ranks waiting on this group for long.
    _control["group"] = dist.new_group(backend="gloo", timeout=CONTROL_TIMEOUT)
    _info["info"] = info
    return info


def control_group() -> Any:
    """A gloo group over the whole world for the control plane (pickled objects, CPU tensors).

    The RL controller ships batches and decisions over it, and the weight export streams buckets
    to rank 0 over it, so neither needs CUDA tensors when the training backend is NCCL. Its
    timeout (``CONTROL_TIMEOUT``) covers a long rollout or eval on the controller while the
    trainer ranks wait. Created by :func:`init_distributed` on every rank (``new_group`` is
    collective).
    """
    if "group" not in _control:
        raise RuntimeError("control_group() needs init_distributed() first")
    return _control["group"]


def destroy_distributed(keep_process_group: bool = False) -> None:
    """Tear down Megatron's groups and the default process group (safe to call twice).

    ``keep_process_group=True`` keeps torch.distributed up, so the same processes can call
    :func:`init_distributed` again with another layout (used to compare layouts in one launch).
    """
    from megatron.core import parallel_state as mpu

    _info.pop("info", None)
    if _control.get("group") is not None and dist.is_initialized():
        dist.destroy_process_group(_control["group"])  # type: ignore[arg-type]
    _control.pop("group", None)
    if mpu.model_parallel_is_initialized():
        mpu.destroy_model_parallel()
    if dist.is_initialized() and not keep_process_group:
        dist.destroy_process_group()
