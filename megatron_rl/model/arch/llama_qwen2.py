"""Llama (``LlamaForCausalLM``) and Qwen2 (``Qwen2ForCausalLM``): the dense family as it is.

They differ in one tensor and a few ``config.json`` keys: Qwen2 biases q/k/v (and nothing else),
Llama has no bias. Refused instead of converted into a silently different model: Llama's
``attention_bias`` / ``mlp_bias`` (HF's Llama attention bias also biases ``o_proj``, which
Megatron's shape has no place for) and Qwen2's sliding window.
"""

from __future__ import annotations

from typing import Any

from megatron_rl.model.arch.base import DenseFamily
from megatron_rl.model.config import ModelConfig


class Llama(DenseFamily):
    arch = "llama"
    hf_class = "LlamaForCausalLM"
    model_type = "llama"

    def refuse(self, config: dict[str, Any]) -> None:
        super().refuse(config)
        if config.get("attention_bias") or config.get("mlp_bias"):
            raise ValueError(
                "Llama attention_bias/mlp_bias=true is not supported (Megatron's "
                "Llama shape has no o_proj/MLP bias); only false"
            )

    def hf_fields(self, cfg: ModelConfig) -> dict[str, Any]:
        return {**super().hf_fields(cfg), "attention_bias": False, "mlp_bias": False}


class Qwen2(DenseFamily):
    arch = "qwen2"
    hf_class = "Qwen2ForCausalLM"
    model_type = "qwen2"
    qkv_bias = True

    def refuse(self, config: dict[str, Any]) -> None:
        super().refuse(config)
        if config.get("use_sliding_window"):
            raise ValueError(
                f"{self.hf_class} use_sliding_window=true is not supported; only false"
            )

    def hf_fields(self, cfg: ModelConfig) -> dict[str, Any]:
        return {**super().hf_fields(cfg), "use_sliding_window": False}

    def drop_hf_keys(self) -> tuple[str, ...]:
        # layer_types is stale when num_layers changed; HF rebuilds it
        return (*super().drop_hf_keys(), "layer_types")
