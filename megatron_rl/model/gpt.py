"""Build a megatron-core ``GPTModel`` of Llama / Qwen2 shape from :class:`ModelConfig`.

The shape: RMSNorm, SwiGLU MLP (``gated_linear_unit`` + SiLU), RoPE with ``rotary_base``,
grouped-query attention (``num_query_groups``), optional QKV bias (Qwen2), no other biases,
optionally tied input/output embeddings. Dropout is 0 (RL and SFT on small data do not use it, and
it keeps the trainer's log-probs deterministic so they can match the rollout engine's).

Layer spec: Transformer Engine's when it imports (GPU clusters), megatron-core's local spec
otherwise (CPU). With the local spec, attention takes an explicit boolean mask (True = masked),
which the policy builds block-diagonal for packed sequences.

Only keyword arguments are passed to megatron-core builders, because 0.19.x inserted parameters
into ``get_gpt_layer_local_spec`` and friends (see DESIGN.md); ``GPTModel`` exists in both 0.16.1
and 0.19.x.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from megatron_rl.model.config import ModelConfig, ParallelConfig
from megatron_rl.model.parallel import have_transformer_engine

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def use_te_spec() -> bool:
    """TE layer spec only with CUDA and Transformer Engine; the local spec everywhere else."""
    return torch.cuda.is_available() and have_transformer_engine()


def transformer_config(cfg: ModelConfig, parallel: ParallelConfig) -> Any:
    """The megatron ``TransformerConfig`` for ``cfg`` under the ``parallel`` layout."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    dtype = DTYPES[cfg.dtype]
    recompute: dict[str, Any] = {}
    if cfg.recompute == "full":
        recompute = dict(
            recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1
        )
    elif cfg.recompute == "selective":
        recompute = dict(recompute_granularity="selective")
    return TransformerConfig(
        num_layers=cfg.num_layers,
        hidden_size=cfg.hidden_size,
        ffn_hidden_size=cfg.ffn_hidden_size,
        num_attention_heads=cfg.num_attention_heads,
        num_query_groups=cfg.num_query_groups,
        kv_channels=cfg.head_dim,
        normalization="RMSNorm",
        layernorm_epsilon=cfg.norm_epsilon,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=cfg.qkv_bias,
        bias_activation_fusion=False,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        init_method_std=cfg.init_std,
        params_dtype=dtype,
        pipeline_dtype=dtype,
        bf16=dtype == torch.bfloat16,
        fp16=dtype == torch.float16,
        tensor_model_parallel_size=parallel.tp,
        pipeline_model_parallel_size=parallel.pp,
        context_parallel_size=parallel.cp,
        sequence_parallel=False,
        use_cpu_initialization=not torch.cuda.is_available(),
        **recompute,
    )


def layer_spec(cfg: ModelConfig) -> Any:
    """Transformer-layer spec: TE on GPU when available, megatron-core local otherwise."""
    from megatron.core.models.gpt import gpt_layer_specs as specs

    if use_te_spec():
        return specs.get_gpt_layer_with_transformer_engine_spec(qk_layernorm=False)
    return specs.get_gpt_layer_local_spec(normalization="RMSNorm", qk_layernorm=False)


def build_gpt_model(
    cfg: ModelConfig,
    pre_process: bool,
    post_process: bool,
    parallel: ParallelConfig | None = None,
) -> Any:
    """One pipeline stage of the policy as a megatron ``GPTModel`` (on CPU or the current GPU).

    ``pre_process``: this stage holds the embedding; ``post_process``: the final norm and the
    output layer. Megatron's parallel state must already be initialised (see ``parallel.py``).
    Forward: ``model(input_ids [B, S], position_ids [B, S], attention_mask [B, 1, S, S] bool)``
    returns logits ``[B, S, V / tp]`` on the last stage, hidden ``[S, B, H]`` elsewhere.
    """
    from megatron.core.models.gpt import GPTModel

    parallel = parallel or ParallelConfig()
    model = GPTModel(
        config=transformer_config(cfg, parallel),
        transformer_layer_spec=layer_spec(cfg),
        vocab_size=cfg.vocab_size,
        max_sequence_length=cfg.max_position_embeddings,
        pre_process=pre_process,
        post_process=post_process,
        parallel_output=True,
        share_embeddings_and_output_weights=cfg.tie_embeddings,
        position_embedding_type="rope",
        rotary_base=int(cfg.rotary_base),
    )
    if torch.cuda.is_available():
        model.cuda(torch.cuda.current_device())
    return model
