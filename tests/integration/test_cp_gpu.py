"""Context parallelism on GPUs (Transformer Engine): CP = 2 must reproduce CP = 1.

GPU-only (``@pytest.mark.gpu``; needs >= 2 CUDA devices and transformer_engine). Two torchrun
jobs run this file as a worker:

1. ``ref``: one process, CP = 1: builds the TE-spec GPTModel (bf16; TE's THD/CP attention has no
   fp32 kernel), saves its weights, the packed batch and the reference per-token log-probs and
   the gradient of a token-mean loss.
2. ``cp``: two processes, CP = 2: load the same weights, split the batch with
   ``megatron_rl.model.cp.te.te_cp_inputs``, check the split against TE's own
   ``thd_get_partitioned_indices``, run forward/backward on the local shard, all-gather the
   log-probs and all-reduce the gradients over the CP group, and save them.

The test then compares the two (bf16 tolerances).
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

LENS = [37, 128, 5, 90]


def _cfg():
    from megatron_rl.model.config import ModelConfig

    return ModelConfig(
        num_layers=2,
        hidden_size=128,
        ffn_hidden_size=256,
        num_attention_heads=2,
        num_query_groups=1,
        vocab_size=128,
        max_position_embeddings=512,
        dtype="bfloat16",
    )


def _batch():
    from megatron_rl.packing.batch import pack

    rng = random.Random(0)
    seqs = [[rng.randrange(128) for _ in range(n)] for n in LENS]
    return pack(seqs, [[1.0] * n for n in LENS])


def _worker(mode: str, out: Path) -> None:
    import torch.distributed as dist
    from megatron.core import parallel_state as mpu

    from megatron_rl.model.config import ParallelConfig
    from megatron_rl.model.cp.shard import make_layout, merge, to_token_aligned
    from megatron_rl.model.cp.te import (
        cp_token_logprobs,
        gather_token_logprobs,
        te_cp_inputs,
        te_partition_index,
    )
    from megatron_rl.model.gpt import build_gpt_model
    from megatron_rl.model.parallel import init_distributed

    cp = 1 if mode == "ref" else 2
    cfg = _cfg()
    info = init_distributed(ParallelConfig(cp=cp), seed=7)
    model = build_gpt_model(
        cfg, pre_process=True, post_process=True, parallel=ParallelConfig(cp=cp)
    )
    if mode == "cp":
        model.load_state_dict(
            torch.load(out / "weights.pt", map_location=info.device, weights_only=True),
            strict=False,
        )
    batch = _batch()
    inputs = te_cp_inputs(batch, cp, info.cp_rank, info.device)
    if cp > 1:
        ours = make_layout(batch.cu_seqlens, cp).rank_index[info.cp_rank].to(info.device)
        assert torch.equal(te_partition_index(inputs, cp, info.cp_rank).long(), ours)
    logits = model(
        inputs.tokens, inputs.position_ids, None, packed_seq_params=inputs.packed_seq_params
    )
    local_lp = cp_token_logprobs(logits, inputs.shard)
    mask = inputs.shard.label_mask.to(info.device)
    n_global = float(batch.loss_mask.sum())  # same normaliser on every CP rank
    (-(local_lp * mask).sum() / n_global).backward()
    grads = {n: p.grad.float() for n, p in model.named_parameters() if p.grad is not None}
    if cp > 1:
        group = mpu.get_context_parallel_group()
        for g in grads.values():
            dist.all_reduce(g, group=group)
        lp = gather_token_logprobs(local_lp.detach(), inputs.shard, group=group)
    else:
        lp = to_token_aligned(
            merge([local_lp.detach()], inputs.shard.layout),
            inputs.shard.layout.cu_seqlens.to(info.device),
        )
        torch.save(model.state_dict(), out / "weights.pt")
    if info.rank == 0:
        torch.save(
            {"lp": lp.cpu(), "grads": {k: v.cpu() for k, v in grads.items()}}, out / f"{mode}.pt"
        )
    dist.barrier()


def _torchrun(nproc: int, mode: str, out: Path) -> None:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc_per_node={nproc}",
        __file__,
        mode,
        str(out),
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]


@pytest.mark.gpu
def test_cp2_matches_cp1(tmp_path: Path) -> None:
    if torch.cuda.device_count() < 2:
        pytest.skip("CP = 2 needs two CUDA devices")
    pytest.importorskip("transformer_engine")
    _torchrun(1, "ref", tmp_path)
    _torchrun(2, "cp", tmp_path)
    ref = torch.load(tmp_path / "ref.pt", weights_only=True)
    got = torch.load(tmp_path / "cp.pt", weights_only=True)
    assert ref["lp"].shape == got["lp"].shape == (sum(LENS),)
    assert (ref["lp"] - got["lp"]).abs().max().item() < 5e-2  # bf16 attention, two kernels
    for name, g in ref["grads"].items():
        rel = (g - got["grads"][name]).norm() / g.norm().clamp_min(1e-8)
        assert rel.item() < 5e-2, f"{name}: relative grad error {rel.item():.3f}"
    shutil.rmtree(tmp_path, ignore_errors=True)


if __name__ == "__main__":  # torchrun worker
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    _worker(sys.argv[1], Path(sys.argv[2]))
