"""Build a megatron-core ``GPTModel`` (Llama / Qwen2 / Qwen3 / Qwen3-MoE) from :class:`ModelConfig`.

The shape: RMSNorm, SwiGLU MLP (``gated_linear_unit`` + SiLU) or megatron-core's MoE layer of
SwiGLU experts (``moe.py``), RoPE with ``rotary_base``, grouped-query attention
(``num_query_groups``, head width ``kv_channels``), optional QKV bias (Qwen2), optional QK
layernorm (Qwen3: the family's ``spec_options``), no other biases, optionally tied input/output
embeddings. Dropout is 0 (RL and SFT on small data do not use it, and
it keeps the trainer's log-probs deterministic so they can match the rollout engine's).

Layer spec: Transformer Engine's when it imports (GPU clusters), megatron-core's local spec
otherwise (CPU), whose core attention is swapped for ``attention.VarlenDotProductAttention``: packed
rows go in the THD layout with ``PackedSeqParams`` on both paths (no ``[T, T]`` mask); unpacked
``[B, S]`` batches still take an explicit boolean mask (True = masked).

Helpers for the model's inputs and outputs live here too: the block-diagonal causal mask of a
packed row, and log-probs / entropy computed from vocab-parallel logits with TP all-reduces.

Only keyword arguments are passed to megatron-core builders, because 0.19.x inserted parameters
into ``get_gpt_layer_local_spec`` and friends (see DESIGN.md); ``GPTModel`` exists in both 0.16.1
and 0.19.x.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

from megatron_rl.model import moe
from megatron_rl.model.arch import family
from megatron_rl.model.config import ModelConfig, ParallelConfig
from megatron_rl.model.parallel import use_te_spec
from megatron_rl.packing.batch import PackedBatch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


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
        qk_layernorm=family(cfg).qk_norm,  # also: finalize_model_grads sums its grads over TP
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
        **moe.transformer_kwargs(cfg, parallel),
    )


def layer_spec(cfg: ModelConfig, cp: int = 1) -> Any:
    """Transformer-layer spec: TE on GPU when available, megatron-core local otherwise.

    The architecture's options (its family's ``spec_options``: QK layernorm, ...) go to both.
    The local spec's core attention takes TE's THD ``PackedSeqParams`` interface: with ``cp > 1``
    the CPU context-parallel one (``megatron_rl/model/cp/attention.py``), else
    :class:`~megatron_rl.model.attention.VarlenDotProductAttention` (per-sequence causal SDPA for
    packed rows; the dense masked path for unpacked ``[B, S]`` batches).
    """
    from megatron.core.models.gpt import gpt_layer_specs as specs

    options = family(cfg).spec_options(cfg)  # qk_layernorm, num_experts of this architecture
    if use_te_spec():
        if cfg.is_moe:
            options["moe_grouped_gemm"] = True  # TEGroupedMLP
        return specs.get_gpt_layer_with_transformer_engine_spec(**options)
    spec = specs.get_gpt_layer_local_spec(normalization="RMSNorm", **options)
    if cp > 1:
        from megatron_rl.model.cp.attention import CPDotProductAttention

        spec.submodules.self_attention.submodules.core_attention = CPDotProductAttention
    else:
        from megatron_rl.model.attention import VarlenDotProductAttention

        spec.submodules.self_attention.submodules.core_attention = VarlenDotProductAttention
    return spec


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
        transformer_layer_spec=layer_spec(cfg, parallel.cp),
        vocab_size=cfg.vocab_size,
        max_sequence_length=cfg.max_position_embeddings,
        pre_process=pre_process,
        post_process=post_process,
        parallel_output=True,
        share_embeddings_and_output_weights=cfg.tie_embeddings,
        position_embedding_type="rope",
        rotary_base=int(cfg.rotary_base),
    )
    moe.allow_tp_without_sp(model, parallel.tp)  # MoE layers only (see moe.py)
    if not use_te_spec():  # shared-prefix rows (per-token RoPE) run on the local spec only
        from megatron_rl.model.attention import install_token_rope

        install_token_rope(model)
    if torch.cuda.is_available():
        model.cuda(torch.cuda.current_device())
    return model


# ----------------------------------------------------------------------------------------------
# model inputs (THD packed-sequence params, the dense packed mask) and outputs (log-probs)


def thd_params(cu_seqlens: Tensor) -> Any:
    """Megatron ``PackedSeqParams`` (THD layout) of one packed row: what TE's attention and our
    local ``VarlenDotProductAttention`` take instead of a mask; RoPE restarts in every sequence."""
    from megatron.core.packed_seq_params import PackedSeqParams

    cu = cu_seqlens.int()
    longest = int((cu[1:] - cu[:-1]).max())
    return PackedSeqParams(
        qkv_format="thd",
        cu_seqlens_q=cu,
        cu_seqlens_kv=cu,
        max_seqlen_q=longest,
        max_seqlen_kv=longest,
    )


def block_causal_mask(cu_seqlens: Tensor, total: int) -> Tensor:
    """Boolean mask [1, 1, T, T], True where attention is *not* allowed (Megatron convention)."""
    lens = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    seg = torch.repeat_interleave(torch.arange(lens.numel(), device=cu_seqlens.device), lens)
    idx = torch.arange(total, device=cu_seqlens.device)
    allowed = (seg[:, None] == seg[None, :]) & (idx[None, :] <= idx[:, None])
    return ~allowed[None, None]


def vocab_parallel_logprobs(
    logits: Tensor, targets: Tensor, temperature: float | Tensor, with_entropy: bool
) -> tuple[Tensor, Tensor | None]:
    """Log-prob of ``targets`` and entropy under softmax(logits / temperature), TP-aware.

    logits: [N, V / tp] (this rank's vocab slice), targets: [N] global ids, temperature: one
    float for every row or a [N] tensor (row i's temperature; the same on every TP rank, since
    each rank holds a vocab slice of the same rows). Returns logprobs [N] and entropy [N] (or
    None), replicated over TP ranks, differentiable.
    """
    from megatron.core import parallel_state as mpu
    from megatron.core.tensor_parallel.mappings import reduce_from_tensor_model_parallel_region

    if isinstance(temperature, Tensor) and temperature.numel() != 1:
        if temperature.numel() != logits.shape[0]:
            raise ValueError(
                f"per-row temperature must have shape {tuple(logits.shape[:1])}, "
                f"got {tuple(temperature.shape)}"
            )
        t = temperature.reshape(-1, 1).to(device=logits.device, dtype=torch.float32)
        z = logits.float() / t
    else:
        z = logits.float() / float(temperature)
    tp_group = mpu.get_tensor_model_parallel_group()
    reduce = partial(reduce_from_tensor_model_parallel_region, group=tp_group)
    zmax = z.detach().max(dim=-1).values
    if mpu.get_tensor_model_parallel_world_size() > 1:
        dist.all_reduce(zmax, op=dist.ReduceOp.MAX, group=tp_group)
    shifted = z - zmax[:, None]
    exp = shifted.exp()
    sum_exp = reduce(exp.sum(-1))
    log_z = sum_exp.log()
    vocab_local = z.shape[-1]
    start = mpu.get_tensor_model_parallel_rank() * vocab_local
    local = targets - start
    mine = (local >= 0) & (local < vocab_local)
    picked = shifted.gather(-1, local.clamp(0, vocab_local - 1)[:, None]).squeeze(-1)
    target_logit = reduce(torch.where(mine, picked, 0.0))
    logprobs = target_logit - log_z
    if not with_entropy:
        return logprobs, None
    expected = reduce((exp * shifted).sum(-1))
    return logprobs, log_z - expected / sum_exp


TEMPERATURE_KEY = "temp"  # PackedBatch.extras key of the per-token sampling temperature


def prediction_temperatures(batch: PackedBatch, default: float) -> float | Tensor:
    """Temperature of each prediction row ``logits[:-1]`` (row t-1 predicts token t): [T-1].

    ``batch.extras["temp"][t]`` is the temperature token t was sampled at (the RL loop sets it
    per sample, see ``controller/batches.build_batches``); without it every row uses ``default``.
    """
    temps = batch.extras.get(TEMPERATURE_KEY)
    return default if temps is None else temps[1:]


def align_to_tokens(values: Tensor, batch: PackedBatch) -> Tensor:
    """values [T-1] predicted from positions 0..T-2 -> [T] aligned with tokens, 0 at seq starts."""
    out = torch.cat([values.new_zeros(1), values])
    starts = torch.zeros_like(out, dtype=torch.bool)
    starts[batch.cu_seqlens[:-1].long()] = True
    return torch.where(starts, torch.zeros_like(out), out)
