"""Megatron logits of a converted checkpoint vs. the HF model's, under torchrun (TP, PP, EP).

    torchrun --nproc_per_node N tests/integration/dist/convert_logits.py --hf HF_DIR --ckpt MEGATRON_DIR \
        --result OUT.json

Every rank builds its stage of the policy, loads *its own* rank file of the Megatron directory
written by ``megatron-rl convert hf-to-megatron`` (so the TP/PP sharding is exercised, not just the
names), and runs a forward pass; rank 0 compares the gathered full-vocabulary logits with an fp32
``transformers`` forward of the source HF checkpoint and writes the max abs difference to --result.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import safetensors.torch
import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM

from megatron_rl.model.config import ParallelConfig
from megatron_rl.model.hf_io import load_megatron_meta, rank_file
from megatron_rl.model.parallel import destroy_distributed, init_distributed
from megatron_rl.model.policy import Policy


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hf", required=True)
    parser.add_argument("--ckpt", required=True)
    parser.add_argument("--result", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    meta, cfg = load_megatron_meta(args.ckpt)
    layout = ParallelConfig(tp=meta["tp"], pp=meta["pp"], ep=meta["ep"], etp=meta["etp"])
    info = init_distributed(layout, seed=0)
    policy = Policy(cfg, info)
    ep_rank = info.ep_rank if info.ep > 1 else None  # the per-EP-rank file of a split MoE
    path = rank_file(Path(args.ckpt), info.tp_rank, info.pp_rank, ep_rank)
    shard = safetensors.torch.load_file(str(path))
    policy.load_model_state_shard(shard)
    tokens = torch.randint(0, cfg.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    logits = policy.logits(tokens)  # [B, S, V] on every rank
    if dist.get_rank() == 0:
        hf = AutoModelForCausalLM.from_pretrained(args.hf, dtype=torch.float32).eval()
        with torch.no_grad():
            ref = hf(tokens).logits
        result = {
            "tp": info.tp,
            "pp": info.pp,
            "shape": list(logits.shape),
            "max_abs_diff": float((logits - ref).abs().max()),
            "ref_abs_max": float(ref.abs().max()),
        }
        Path(args.result).write_text(json.dumps(result))
        print(json.dumps(result))
    destroy_distributed()


if __name__ == "__main__":
    main()
