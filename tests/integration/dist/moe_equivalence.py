"""A Qwen3-MoE policy under several EP / TP layouts in one launch; rank 0 saves what each computed.

    torchrun --nproc_per_node 4 tests/integration/dist/moe_equivalence.py --out-dir DIR [--layouts a,b]

Layouts (tp, ep, etp), one after the other in the same four processes (Megatron's groups are
rebuilt between them, the gloo world is kept): ``ref`` (TP=1, EP=1: DP=4 with the same data on
every rank, which equals one process), ``ep2`` (EP=2 x expert-DP=2; dense DP=4), ``ep2tp2``
(EP=2 x TP=2, each expert split over the two TP ranks) and ``ep2tp2etp1`` (EP=2 x TP=2 with whole
experts). Results go to ``DIR/<layout>.pt``.

Every layout starts from the same seeded random HF-layout weights (loaded through
``Policy.load_hf_state_dict``, so each rank takes its own TP / EP shard) and replays the same
*fixed* routing (random top-k experts per token and layer, the same in every layout), so that a
near-tie cannot pick different experts in different layouts. Then two RL steps of the real
``rl_step.train_step`` (GRPO loss with TIS against made-up engine log-probs; the router's
z-loss on), recording per step: logits of two unpacked rows (their routes replayed too), the
gradients in HF layout (the DDP-reduced main grads, exported like the weights, just before the
optimizer step) and the step's metrics; and the HF weights after the last step.
``tests/integration/test_moe_equivalence.py`` compares the files.
"""

from __future__ import annotations

import torch

from megatron_rl.packing.batch import PackedBatch, pack
from megatron_rl.config import RunConfig
from megatron_rl.model import convert
from megatron_rl.model.config import ModelConfig, MoEConfig, ParallelConfig
from megatron_rl.model.moe import ROUTES_KEY, routes_extra
from megatron_rl.model.parallel import init_distributed
from megatron_rl.model.policy import Policy
from megatron_rl.config.train import RLConfig, TrainConfig
from megatron_rl.losses import global_normalizer
from megatron_rl.train.step import train_step

CFG = ModelConfig(
    arch="qwen3_moe",
    num_layers=2,
    hidden_size=64,
    ffn_hidden_size=128,
    num_attention_heads=4,
    num_query_groups=2,
    head_size=16,
    vocab_size=128,
    max_position_embeddings=128,
    qkv_bias=False,
    moe=MoEConfig(num_experts=4, topk=2, ffn_hidden_size=32, z_loss_coeff=1e-2),
)
LAYOUTS = {"ref": (1, 1, 0), "ep2": (1, 2, 0), "ep2tp2": (2, 2, 0), "ep2tp2etp1": (2, 2, 1)}


def reference_weights(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shapes = sorted(convert.hf_param_shapes(CFG).items())
    return {n: float(n.endswith("norm.weight")) + 0.1 * torch.randn(s, generator=g)
            for n, s in shapes}  # fmt: skip


def fixed_routes(n: int, g: torch.Generator) -> torch.Tensor:
    """Random distinct top-k experts for ``n`` tokens in every layer: ``[n, L, k]``."""
    scores = torch.rand(n, CFG.num_layers, CFG.moe.num_experts, generator=g)
    return scores.topk(CFG.moe.topk, dim=-1).indices


def batches() -> list[PackedBatch]:
    g = torch.Generator().manual_seed(1)
    out = []
    for lens in ((9, 14, 6), (17, 11)):
        seqs = [torch.randint(0, CFG.vocab_size, (n,), generator=g).tolist() for n in lens]
        masks = [[float(i >= n // 3) for i in range(n)] for n in lens]
        extras = {
            "adv": [[float(torch.randn((), generator=g))] * n for n in lens],
            "rollout_lp": [(-2.0 + 0.3 * torch.randn(n, generator=g)).tolist() for n in lens],
            "temp": [[1.0] * n for n in lens],
            ROUTES_KEY: [routes_extra(fixed_routes(n, g)) for n in lens],
        }
        out.append(pack(seqs, masks, extras=extras))
    return out


def hf_grads(policy: Policy) -> dict[str, torch.Tensor]:
    """The accumulated (DDP-reduced) gradients in HF layout, gathered like the weights."""
    params = dict(policy.module.named_parameters())
    saved = {n: p.data.clone() for n, p in params.items()}
    for p in params.values():
        p.data.copy_(p.main_grad)
    try:
        return policy.hf_state_dict()
    finally:
        for n, p in params.items():
            p.data.copy_(saved[n])


def run_layout(tp: int, ep: int, etp: int) -> dict[str, object]:
    info = init_distributed(ParallelConfig(tp=tp, ep=ep, etp=etp), seed=0)
    train = TrainConfig(lr=1e-2, grad_clip=1.0, adam_eps=1e-4, steps=2)
    policy = Policy(CFG, info, train)
    policy.load_hf_state_dict(reference_weights(seed=0))
    cfg = RunConfig(model=CFG, train=train, rl=RLConfig(tis_cap=2.0, entropy_coef=0.01))
    data = batches()
    # every DP rank trains on the same data: the step's normaliser counts it dp times
    norm = global_normalizer([data] * info.dp, cfg.rl.loss_agg)
    g = torch.Generator().manual_seed(2)
    tokens = torch.randint(0, CFG.vocab_size, (2, 16), generator=g)
    row_routes = fixed_routes(2 * 16, g).view(2, 16, CFG.num_layers, CFG.moe.topk)
    grads: list[dict[str, torch.Tensor]] = []
    real_step = policy.optimizer_step

    def step_keeping_grads(lr: float) -> dict[str, float]:
        grads.append(hf_grads(policy))
        return real_step(lr)

    policy.optimizer_step = step_keeping_grads  # type: ignore[method-assign]
    result: dict[str, object] = {"dp": info.dp, "logits": [], "metrics": [], "grads": grads}
    for step in range(2):
        result["logits"].append(policy.logits(tokens, row_routes))  # type: ignore[attr-defined]
        metrics = train_step(policy, cfg, data, step, None, norm)
        result["metrics"].append(metrics)  # type: ignore[attr-defined]
    result["logits"].append(policy.logits(tokens, row_routes))  # type: ignore[attr-defined]
    result["free_logits"] = policy.logits(tokens)  # routed by the trainer itself
    result["hf_after"] = policy.hf_state_dict()
    return result


def main() -> None:
    from layout_runner import run_layouts  # beside this script (run as a file by torchrun)

    run_layouts(LAYOUTS, run_layout, default=",".join(LAYOUTS))


if __name__ == "__main__":
    main()
