"""Policy under context parallelism vs without it, in one launch; rank 0 saves what each computed.

    torchrun --nproc_per_node 2 tests/integration/dist/cp_equivalence.py --out-dir DIR [--layouts ref,cp2]

Layouts, one after the other in the same processes (Megatron's groups are rebuilt in between):
``ref`` (CP=1, TP=1: every rank a data-parallel replica of the same data, which equals one
process), ``cp2`` (CP=2; with 4 processes CP=2 x DP=2), ``cp2tp2`` (CP=2 x TP=2, 4
processes) and ``cp4`` (CP=4, 4 processes). Results go to ``DIR/<layout>.pt``.

Every layout loads the same seeded HF-layout weights, then computes: full-vocab logits of two
rows, log-probs/entropies of packed batches with mixed sequence lengths (none a multiple of
``2 * cp``, so every sequence is padded; one far longer than a chunk), the parameter gradients of
one ``forward_backward`` (HF names, gathered over TP), the same two with the CP padding tokens
set to another id (``poisoned_pads``: padding must not reach any result), then two RL steps through
``rl_step.train_step`` and the HF weights after them; and shared-prefix rows against plain
packing of the same samples (``shared_prefix``). ``tests/integration/test_cp_equivalence.py`` compares.
"""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from megatron_rl.packing.batch import PackedBatch, pack
from megatron_rl.config import load_config
from megatron_rl.model import convert
from megatron_rl.model import policy as policy_module
from megatron_rl.model.config import ModelConfig, ParallelConfig
from megatron_rl.model.parallel import init_distributed
from megatron_rl.model.policy import Policy
from megatron_rl.losses import global_normalizer
from megatron_rl.train.step import train_step

CFG = ModelConfig(
    num_layers=2,
    hidden_size=64,
    ffn_hidden_size=128,
    num_attention_heads=4,
    num_query_groups=2,
    vocab_size=96,
    max_position_embeddings=256,
)
LENGTHS = ((7, 13, 2, 5), (41, 9), (3, 11, 6))  # 3 micro-batches; 41 tokens >> a CP=2 chunk
# name -> (cp, tp, cp_min_tokens); cp2switch: the two short micro-batches run whole, one per CP
# rank, the one holding 41 tokens is split (long_context/cp_switch.py)
LAYOUTS = {"ref": (1, 1, 0), "cp2": (2, 1, 0), "cp2tp2": (2, 2, 0), "cp4": (4, 1, 0),
           "cp2switch": (2, 1, 20)}  # fmt: skip


def reference_weights(cfg: ModelConfig, seed: int) -> dict[str, torch.Tensor]:
    """A random HF-layout state dict, identical in every process for the same seed."""
    g = torch.Generator().manual_seed(seed)
    sd = {}
    for name, shape in sorted(convert.hf_param_shapes(cfg).items()):
        base = 1.0 if name.endswith("norm.weight") else 0.0
        sd[name] = base + 0.1 * torch.randn(shape, generator=g)
    return sd


def batches(seed: int = 1) -> list[PackedBatch]:
    """Packed RL micro-batches: responses in the second half, advantages, engine log-probs and
    per-token temperatures."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for lens in LENGTHS:
        seqs = [torch.randint(1, CFG.vocab_size, (n,), generator=g).tolist() for n in lens]
        masks = [[float(i >= n // 2) for i in range(n)] for n in lens]
        advs = [[float(torch.randn((), generator=g))] * n for n in lens]
        rlps = [(-2.0 - torch.rand(n, generator=g)).tolist() for n in lens]
        # per-token sampling temperatures, one per sequence as RL packs them (issue 14): the CP
        # shards must score each label at its own sequence's temperature
        temps = [[(0.6, 1.4)[k % 2]] * n for k, n in enumerate(lens)]
        extras = {"adv": advs, "rollout_lp": rlps, "temp": temps}
        out.append(pack(seqs, masks, extras=extras))
    return out


def hf_grads(policy: Policy) -> dict[str, torch.Tensor]:
    """The accumulated (DP x CP reduced) gradients in HF layout, full tensors on every rank."""
    grads = {}
    for name, p in policy.module.named_parameters():
        g = getattr(p, "main_grad", None)
        grads[name] = (g if g is not None else p.grad).detach().clone().cpu()
    d = policy.dist
    gathered: list[object] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (d.dp_rank, d.cp_rank, d.tp_rank, grads))
    shards = {(tp, 0): sd for dp, cp, tp, sd in gathered if dp == 0 and cp == 0}  # type: ignore[misc]
    return convert.megatron_to_hf(shards, CFG, d.tp, 1)


def poisoned_pads(policy: Policy, data: list[PackedBatch], loss_fn: Any) -> dict[str, object]:
    """Log-probs and grads again, with the CP padding tokens set to another id (not 0)."""
    real = policy_module.te_cp_inputs
    policy_module.te_cp_inputs = partial(real, pad_id=CFG.vocab_size - 1)
    try:
        scored = policy.token_logprobs(data, temperature=0.8)
        policy.forward_backward(data, loss_fn, temperature=0.8)
        grads = hf_grads(policy)
        policy.zero_grad()
    finally:
        policy_module.te_cp_inputs = real
    return {"logprobs": [lp for lp, _ in scored], "grads": grads}


def shared_prefix(policy: Policy) -> dict[str, object]:
    """Shared-prefix rows (tests/prefix_data.py groups; prefixes split over the CP ranks) and
    the same samples packed plainly: log-probs, entropies, gradients in HF layout."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/prefix_data.py
    from prefix_data import layouts, main_grads, make_groups

    d = make_groups(CFG.vocab_size, seed=5)
    plain, shared = layouts(d, temps=True)
    out: dict[str, object] = {"plens": d["plens"]}
    for name, batch in (("plain", plain), ("shared", shared)):
        ((lp, ent),) = policy.token_logprobs([batch], with_entropy=True)
        main_grads(policy, [batch], float(plain.loss_mask.sum()), keep=True)
        out[name] = {"batch": batch, "lp": lp, "ent": ent, "grads": hf_grads(policy)}
        policy.zero_grad()
    return out


def rl_step(policy: Policy, cfg: Any, data: list[PackedBatch], step: int) -> dict[str, float]:
    """One RL step as the controller runs it: every DP rank holds a share of the step (here the
    same data), and the loss normaliser covers all the shares."""
    norm = global_normalizer([data] * policy.dist.dp, cfg.rl.loss_agg)
    return train_step(policy, cfg, data, step, normalizer=norm)


def run_layout(cp: int, tp: int, cp_min_tokens: int) -> dict[str, object]:
    cfg = load_config(None, ["rl.loss_agg=token_mean", "train.lr=1e-2", "train.grad_clip=1.0"])
    cfg.train.adam_eps = 1e-4  # well above fp32 noise in near-zero grads: steps compare tightly
    cfg.train.warmup_steps = 0
    info = init_distributed(ParallelConfig(tp=tp, cp=cp), seed=0)
    policy = Policy(CFG, info, cfg.train, cp_min_tokens=cp_min_tokens)
    policy.load_hf_state_dict(reference_weights(CFG, seed=0))
    data = batches()
    n_global = float(sum(b.loss_mask.sum() for b in data))

    def loss_fn(batch: PackedBatch, logprobs: torch.Tensor, entropy: torch.Tensor):
        pg = -(batch.extras["adv"] * logprobs * batch.loss_mask).sum() / n_global
        ent = (entropy * batch.loss_mask).sum() / n_global
        return pg - 0.01 * ent, {"pg": pg.detach()}

    tokens = torch.randint(1, CFG.vocab_size, (2, 19), generator=torch.Generator().manual_seed(2))
    result: dict[str, object] = {"logits": policy.logits(tokens), "dp": info.dp, "cp": info.cp}
    scored = policy.token_logprobs(data, temperature=0.8, with_entropy=True)
    result["logprobs"] = [lp for lp, _ in scored]
    result["entropy"] = [ent for _, ent in scored]
    result["one_short"] = policy.token_logprobs(data[:1])[0][0]  # cp2switch: rank 1 owns nothing
    result["shared_prefix"] = shared_prefix(policy)
    result["metrics"] = policy.forward_backward(data, loss_fn, temperature=0.8)
    result["grads"] = hf_grads(policy)
    policy.zero_grad()
    if cp > 1:
        result["poisoned_pads"] = poisoned_pads(policy, data, loss_fn)
        try:  # CP ranks handed different batches: both refuse, nothing hangs
            policy.token_logprobs(batches(seed=100 + dist.get_rank()))
        except ValueError as e:
            result["different_batches_error"] = str(e)
    result["rl"] = [rl_step(policy, cfg, batches(seed=10 + step), step) for step in range(2)]
    result["hf_after"] = policy.hf_state_dict()
    return result


def main() -> None:
    from layout_runner import run_layouts  # beside this script (run as a file by torchrun)

    run_layouts(LAYOUTS, run_layout, default="ref,cp2")


if __name__ == "__main__":
    main()
