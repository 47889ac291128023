"""Qwen3-MoE (``Qwen3MoeForCausalLM``, e.g. Qwen3-30B-A3B): Qwen3 attention, MoE MLP everywhere.

Routing, as HF computes it: ``softmax(router_logits)``, the ``num_experts_per_tok`` largest,
divided by their sum when ``norm_topk_prob`` (released checkpoints: true). Megatron's TopK router
computes the same choice and weights: with ``moe_router_pre_softmax=False`` it takes the top-k of
the logits and a softmax over them (equal to the renormalised probabilities), with ``True`` the
top-k of the full softmax (``norm_topk_prob=false``). No shared experts. HF's
``router_aux_loss_coef`` is a pre-training setting and is kept in ``config.json`` untouched; the
RL run's aux / z-loss weights are ``model.moe.aux_loss_coeff`` / ``z_loss_coeff`` (default off).
"""

from __future__ import annotations

from typing import Any

from megatron_rl.model.arch.moe import MoEMixin, refuse_dense_layers
from megatron_rl.model.arch.qwen3 import Qwen3
from megatron_rl.model.config import ModelConfig, MoEConfig


class Qwen3Moe(MoEMixin, Qwen3):
    arch = "qwen3_moe"
    hf_class = "Qwen3MoeForCausalLM"
    model_type = "qwen3_moe"

    def refuse(self, config: dict[str, Any]) -> None:
        super().refuse(config)
        refuse_dense_layers(config, self.hf_class)

    def config_fields(self, config: dict[str, Any]) -> dict[str, Any]:
        experts = config.get("num_experts", config.get("num_local_experts"))
        if experts is None:
            raise KeyError("num_experts")
        moe = MoEConfig(
            num_experts=int(experts),
            topk=int(config["num_experts_per_tok"]),
            ffn_hidden_size=int(config["moe_intermediate_size"]),
            norm_topk_prob=bool(config.get("norm_topk_prob", False)),
        )
        return {**super().config_fields(config), "moe": moe}

    def hf_fields(self, cfg: ModelConfig) -> dict[str, Any]:
        moe = cfg.moe
        return {
            **super().hf_fields(cfg),
            "num_experts": moe.num_experts,
            "num_local_experts": moe.num_experts,  # the name transformers 5 writes
            "num_experts_per_tok": moe.topk,
            "moe_intermediate_size": moe.ffn_hidden_size,
            "norm_topk_prob": moe.norm_topk_prob,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
        }

    def check_writable(self, cfg: ModelConfig) -> None:
        super().check_writable(cfg)
        if cfg.moe.shared_ffn_hidden_size:
            raise ValueError(
                f"model.moe.shared_ffn_hidden_size={cfg.moe.shared_ffn_hidden_size}: "
                f"{self.hf_class} has no shared experts; use 0"
            )
