"""Qwen3 dense (``Qwen3ForCausalLM``): the dense family plus QK-norm, no QKV bias.

What differs from Qwen2: an RMSNorm over each query and key head (``self_attn.q_norm`` /
``k_norm``, one ``[head_dim]`` weight each, applied before RoPE), which is megatron-core's
``qk_layernorm`` (``self_attention.q_layernorm`` / ``k_layernorm``, replicated over TP); no bias
anywhere; and a ``head_dim`` of its own (Qwen3-0.6B: 1024 wide, 16 heads of 128), which is
Megatron's ``kv_channels``. HF's ``attention_bias`` biases q/k/v *and* o_proj, and the sliding
window is off in every released Qwen3: both are refused.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from megatron_rl.model.arch.base import DenseFamily, RankShard, ShardReader
from megatron_rl.model.config import ModelConfig


class Qwen3(DenseFamily):
    arch = "qwen3"
    hf_class = "Qwen3ForCausalLM"
    model_type = "qwen3"
    qk_norm = True
    free_head_dim = True

    def refuse(self, config: dict[str, Any]) -> None:
        super().refuse(config)
        for key in ("attention_bias", "use_sliding_window"):
            if config.get(key):
                raise ValueError(f"{self.hf_class} {key}=true is not supported; only false")

    def hf_fields(self, cfg: ModelConfig) -> dict[str, Any]:
        return {**super().hf_fields(cfg), "attention_bias": False, "use_sliding_window": False}

    def drop_hf_keys(self) -> tuple[str, ...]:
        # layer_types is stale when num_layers changed; HF rebuilds it
        return (*super().drop_hf_keys(), "layer_types", "max_window_layers")

    def layer_shapes(self, cfg: ModelConfig, i: int) -> dict[str, tuple[int, ...]]:
        a = f"model.layers.{i}.self_attn."
        norms = {a + "q_norm.weight": (cfg.head_dim,), a + "k_norm.weight": (cfg.head_dim,)}
        return {**super().layer_shapes(cfg, i), **norms}

    def attention_to_megatron(
        self, hf_sd: dict[str, Tensor], cfg: ModelConfig, a: str, rank: RankShard
    ) -> dict[str, Tensor]:
        out = super().attention_to_megatron(hf_sd, cfg, a, rank)
        out["self_attention.q_layernorm.weight"] = hf_sd[a + "q_norm.weight"]
        out["self_attention.k_layernorm.weight"] = hf_sd[a + "k_norm.weight"]
        return out

    def attention_to_hf(
        self, st: ShardReader, cfg: ModelConfig, m: str, a: str
    ) -> dict[str, Tensor]:
        out = super().attention_to_hf(st, cfg, m, a)
        out[a + "q_norm.weight"] = st.one(m + "self_attention.q_layernorm.weight")
        out[a + "k_norm.weight"] = st.one(m + "self_attention.k_layernorm.weight")
        return out
