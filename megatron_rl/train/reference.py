"""The frozen reference policy of a KL term, and its log-probs on a step's micro-batches."""

from __future__ import annotations

import torch

from megatron_rl.model.policy import Policy
from megatron_rl.packing.batch import PackedBatch
from megatron_rl.train.runtime import Runtime, export_hf


def build_reference(rt: Runtime) -> Policy | None:
    """A frozen copy of the starting policy, only when a KL term needs it."""
    if rt.cfg.rl.kl_coef <= 0:
        return None
    ref = Policy(rt.cfg.model, rt.dist, None)
    from megatron_rl.model import hf_io

    # the reference is the run's starting point: the HF checkpoint, or the exported random init
    src = rt.cfg.model.hf_path or str(rt.run_dir / "reference_init")
    if not rt.cfg.model.hf_path and rt.start_step == 0:
        export_hf(rt, src)  # collective; rank 0 writes, every rank then reads it
        if torch.distributed.is_initialized():
            torch.distributed.barrier()
    ref.load_hf_state_dict(hf_io.load_hf_weights(src, rt.cfg.model))  # config.json read at start
    return ref


def reference_logprobs(ref: Policy | None, batches: list[PackedBatch]) -> list[torch.Tensor] | None:
    if ref is None:
        return None
    return [lp for lp, _ in ref.token_logprobs(batches)]
