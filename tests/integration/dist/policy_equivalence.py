"""Policy runs under several TP/PP layouts in one launch; rank 0 saves what each computed.

    torchrun --nproc_per_node 2 tests/integration/dist/policy_equivalence.py --out-dir DIR

Layouts, one after the other in the same two processes (Megatron's groups are rebuilt between
them, the gloo world is kept): ``ref`` (TP=1, PP=1, so DP=2 with the same data on both ranks,
which must equal a single process), ``tp2`` and ``pp2``. Results go to ``DIR/<layout>.pt``.

Every layout starts from the same weights: a seeded random HF-layout state dict (the TP=1
reference weights), loaded through ``Policy.load_hf_state_dict`` so each rank takes its own
Megatron shard. Then: full-vocab logits, token log-probs and entropies of two packed batches
(the second carries per-token temperatures, ``extras["temp"]``, so the [T] temperature path of
``vocab_parallel_logprobs`` is compared under the TP vocab split too), shared-prefix against plain
packing of the same groups (``shared_prefix_check``), one ``forward_backward`` +
``optimizer_step``, logits again and the gathered HF state dict (also streamed in small buckets).
``tests/integration/test_parallel_equivalence.py`` compares the files of different layouts.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist

from megatron_rl.packing.batch import PackedBatch, pack
from megatron_rl.model import convert
from megatron_rl.model.config import ModelConfig, ParallelConfig
from megatron_rl.model.export import hf_buckets
from megatron_rl.model.parallel import init_distributed
from megatron_rl.model.policy import Policy
from megatron_rl.config.train import TrainConfig

CFG = ModelConfig(
    num_layers=2,
    hidden_size=128,
    ffn_hidden_size=256,
    num_attention_heads=4,
    num_query_groups=2,
    vocab_size=128,
    max_position_embeddings=128,
)


def reference_weights(cfg: ModelConfig, seed: int) -> dict[str, torch.Tensor]:
    """A random HF-layout state dict, identical in every process for the same seed."""
    g = torch.Generator().manual_seed(seed)
    sd = {}
    for name, shape in sorted(convert.hf_param_shapes(cfg).items()):
        if name.endswith("norm.weight"):
            sd[name] = 1.0 + 0.1 * torch.randn(shape, generator=g)
        else:
            sd[name] = 0.1 * torch.randn(shape, generator=g)
    return sd


def batches() -> list[PackedBatch]:
    g = torch.Generator().manual_seed(1)
    out = []
    for lens in ((7, 12, 5), (20, 9)):
        seqs = [torch.randint(0, CFG.vocab_size, (n,), generator=g).tolist() for n in lens]
        masks = [[float(i >= n // 2) for i in range(n)] for n in lens]
        advs = [[float(torch.randn((), generator=g))] * n for n in lens]
        extras = {"adv": advs}
        if len(lens) == 2:  # per-token sampling temperatures (one per sequence), as RL packs them
            extras["temp"] = [[t] * n for t, n in zip((1.4, 0.6), lens, strict=True)]
        out.append(pack(seqs, masks, extras=extras))
    return out


LAYOUTS = {"ref": (1, 1), "tp2": (2, 1), "pp2": (1, 2)}  # name -> (tp, pp)


def shared_prefix_check(policy: Policy) -> dict[str, object]:
    """Shared-prefix vs plain packing of the same groups, inside this layout.

    Per-sample log-prob / entropy differences at two temperatures, the max difference of any
    parameter's gradient (this rank's shard, maxed over ranks) with per-token temperatures, the
    token counts every rank's first layer ran over, and the shared rows' log-probs (compared
    across layouts by the test).
    """
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/prefix_data.py
    from prefix_data import compare_per_sample, expected_tokens, layouts, main_grads
    from prefix_data import make_groups, rows_seen

    d = make_groups(CFG.vocab_size, seed=4)
    out: dict[str, object] = {"expected_tokens": expected_tokens(d)}
    plain, shared = layouts(d, temps=False)
    seen: list[int] = []
    for t in (0.8, 1.3):
        with rows_seen(policy) as rows:
            ((lp_s, ent_s),) = policy.token_logprobs([shared], t, with_entropy=True)
        seen += rows
        ((lp_p, ent_p),) = policy.token_logprobs([plain], t, with_entropy=True)
        out[f"lp_diff_{t}"] = compare_per_sample(plain, shared, lp_p, lp_s, d["plens"])
        out[f"ent_diff_{t}"] = compare_per_sample(plain, shared, ent_p, ent_s, d["plens"])
        out[f"lp_shared_{t}"] = lp_s
    plain, shared = layouts(d, temps=True)
    n = float(plain.loss_mask.sum())
    g_plain = main_grads(policy, [plain], n)
    with rows_seen(policy) as rows:
        g_shared = main_grads(policy, [shared], n)
    seen += rows
    worst = torch.tensor([max(float((g - g_shared[k]).abs().max()) for k, g in g_plain.items())])
    total = torch.tensor([sum(float(g.abs().sum()) for g in g_plain.values())])
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    dist.all_reduce(total)
    every: list[object] = [None] * dist.get_world_size()
    dist.all_gather_object(every, seen)
    out.update(grad_diff=float(worst), grad_abs_sum=float(total), rows_seen=every)
    return out


def run_layout(tp: int, pp: int) -> dict[str, object]:
    info = init_distributed(ParallelConfig(tp=tp, pp=pp), seed=0)
    # adam_eps well above fp32 noise in near-zero grads, so the step compares tightly.
    policy = Policy(CFG, info, TrainConfig(lr=1e-2, grad_clip=1.0, adam_eps=1e-4))
    policy.load_hf_state_dict(reference_weights(CFG, seed=0))
    data = batches()
    n_global = float(sum(b.loss_mask.sum() for b in data))

    def loss_fn(batch: PackedBatch, logprobs: torch.Tensor, entropy: torch.Tensor):
        pg = -(batch.extras["adv"] * logprobs * batch.loss_mask).sum() / n_global
        ent = (entropy * batch.loss_mask).sum() / n_global
        return pg - 0.01 * ent, {"pg": pg.detach(), "entropy": ent.detach()}

    tokens = torch.randint(0, CFG.vocab_size, (2, 16), generator=torch.Generator().manual_seed(2))
    result: dict[str, object] = {"logits_before": policy.logits(tokens), "dp": info.dp}
    result["shared_prefix"] = shared_prefix_check(policy)
    scored = policy.token_logprobs(data, temperature=0.8, with_entropy=True)
    result["logprobs"] = [lp for lp, _ in scored]
    result["entropy"] = [ent for _, ent in scored]
    result["metrics"] = policy.forward_backward(data, loss_fn, temperature=0.8)
    result["step"] = policy.optimizer_step(lr=1e-2)
    result["logits_after"] = policy.logits(tokens)
    result["hf_after"] = policy.hf_state_dict()
    # the export streamed in ~50 kB buckets (several per PP stage) must give the same tensors
    result["hf_small_buckets"] = [dict(b) for b in hf_buckets(policy, bucket_bytes=50_000)]
    return result


def main() -> None:
    from layout_runner import run_layouts  # beside this script (run as a file by torchrun)

    run_layouts(LAYOUTS, run_layout, default=",".join(LAYOUTS))


if __name__ == "__main__":
    main()
