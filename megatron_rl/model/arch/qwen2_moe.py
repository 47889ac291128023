"""Qwen2-MoE (``Qwen2MoeForCausalLM``, e.g. Qwen1.5-MoE-A2.7B): Qwen2 attention (QKV bias), an MoE
MLP with a gated shared expert in every layer.

The shared expert is a SwiGLU of ``shared_expert_intermediate_size`` whose output is scaled by
``sigmoid(shared_expert_gate(h))`` and added to the routed experts' output: megatron-core's
shared experts with ``moe_shared_expert_gate`` compute the same. HF's ``norm_topk_prob`` is
false by default here (the top-k probabilities are used as they are).
"""

from __future__ import annotations

from typing import Any

from megatron_rl.model.arch.llama_qwen2 import Qwen2
from megatron_rl.model.arch.moe import MoEMixin, refuse_dense_layers
from megatron_rl.model.config import ModelConfig, MoEConfig


class Qwen2Moe(MoEMixin, Qwen2):
    arch = "qwen2_moe"
    hf_class = "Qwen2MoeForCausalLM"
    model_type = "qwen2_moe"
    hf_shared_expert = "shared_expert"

    def refuse(self, config: dict[str, Any]) -> None:
        super().refuse(config)
        refuse_dense_layers(config, self.hf_class)
        if config.get("qkv_bias") is False:
            raise ValueError(f"{self.hf_class} qkv_bias=false is not supported; only true")

    def config_fields(self, config: dict[str, Any]) -> dict[str, Any]:
        shared = int(config.get("shared_expert_intermediate_size") or 0)
        moe = MoEConfig(
            num_experts=int(config["num_experts"]),
            topk=int(config["num_experts_per_tok"]),
            ffn_hidden_size=int(config["moe_intermediate_size"]),
            norm_topk_prob=bool(config.get("norm_topk_prob", False)),
            shared_ffn_hidden_size=shared,
            shared_expert_gate=shared > 0,
        )
        return {**super().config_fields(config), "moe": moe}

    def hf_fields(self, cfg: ModelConfig) -> dict[str, Any]:
        moe = cfg.moe
        return {
            **super().hf_fields(cfg),
            "num_experts": moe.num_experts,
            "num_experts_per_tok": moe.topk,
            "moe_intermediate_size": moe.ffn_hidden_size,
            "shared_expert_intermediate_size": moe.shared_ffn_hidden_size,
            "norm_topk_prob": moe.norm_topk_prob,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
            "qkv_bias": True,
        }

    def check_writable(self, cfg: ModelConfig) -> None:
        super().check_writable(cfg)
        if cfg.moe.shared_expert_gate != (cfg.moe.shared_ffn_hidden_size > 0):
            raise ValueError(
                f"{self.hf_class} gates its shared expert, and only then: "
                "model.moe.shared_expert_gate must be shared_ffn_hidden_size > 0"
            )
