"""Policy architecture and parallel layout."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass
class MoEConfig:
    """Mixture-of-experts MLP of every layer (Qwen3-MoE shape), through megatron-core's MoE layer.

    Routing: softmax over the router logits, the ``topk`` largest, optionally renormalised to sum
    to 1 (``norm_topk_prob``, as HF Qwen3-MoE). ``num_experts: 0`` means a dense model.
    """

    num_experts: int = 0  # routed experts per layer (0: dense MLP, the other fields unused)
    topk: int = 2  # experts each token goes to
    ffn_hidden_size: int = 0  # SwiGLU inner width of one expert (HF moe_intermediate_size)
    norm_topk_prob: bool = True  # renormalise the top-k probabilities (false: raw softmax values)
    aux_loss_coeff: float = 0.0  # weight of the load-balancing (switch) aux loss (0: off)
    z_loss_coeff: float = 0.0  # weight of the router z-loss (0: off)
    shared_ffn_hidden_size: int = 0  # SwiGLU width of the shared expert(s) (0: none)
    shared_expert_gate: bool = False  # sigmoid gate on the shared experts' output (Qwen2-MoE)
    dispatcher: Literal["alltoall", "allgather"] = "alltoall"  # token dispatcher between EP ranks

    def validate(self) -> None:
        if self.num_experts < 0:
            raise ValueError(f"model.moe.num_experts must be >= 0, got {self.num_experts}")
        if not self.num_experts:
            return
        if not 1 <= self.topk <= self.num_experts:
            raise ValueError(
                f"model.moe.topk={self.topk} must be in [1, model.moe.num_experts="
                f"{self.num_experts}]"
            )
        if self.ffn_hidden_size <= 0:
            raise ValueError(f"model.moe.ffn_hidden_size must be > 0, got {self.ffn_hidden_size}")
        for name in ("aux_loss_coeff", "z_loss_coeff", "shared_ffn_hidden_size"):
            if getattr(self, name) < 0:
                raise ValueError(f"model.moe.{name} must be >= 0, got {getattr(self, name)}")
        if self.topk == 1 and self.norm_topk_prob:
            raise ValueError(
                "model.moe.topk=1 with norm_topk_prob=true is not supported (every "
                "routing weight would be 1; megatron-core needs the softmax before "
                "the top-1); use norm_topk_prob=false"
            )
        if self.shared_expert_gate and not self.shared_ffn_hidden_size:
            raise ValueError(
                "model.moe.shared_expert_gate=true needs shared experts "
                "(model.moe.shared_ffn_hidden_size > 0)"
            )


@dataclass
class ModelConfig:
    """A decoder-only GPT: RMSNorm, SwiGLU (dense or mixture of experts), RoPE, GQA."""

    arch: Literal["qwen2", "llama", "qwen3", "qwen3_moe", "qwen2_moe"] = "qwen2"  # model/arch/
    hf_path: str | None = None  # HF-layout checkpoint to start from (None: random init)
    num_layers: int = 4  # transformer blocks
    hidden_size: int = 256  # model width
    ffn_hidden_size: int = 768  # SwiGLU inner width
    num_attention_heads: int = 4  # query heads (head size = hidden_size / heads)
    num_query_groups: int = 2  # key/value heads (GQA); == heads for plain MHA
    head_size: int = 0  # width of one attention head (0: hidden_size / num_attention_heads)
    vocab_size: int = 384  # embedding rows (padded tokenizer size)
    max_position_embeddings: int = 2048  # longest sequence, tokens
    rotary_base: float = 10000.0  # RoPE theta
    norm_epsilon: float = 1e-6  # RMSNorm epsilon
    qkv_bias: bool = True  # bias on the QKV projection (Qwen2: true, Llama: false)
    tie_embeddings: bool = False  # share input embedding and output layer
    init_std: float = 0.02  # std of the random init
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"  # parameter/compute dtype
    recompute: Literal["none", "selective", "full"] = "none"  # activation recomputation
    moe: MoEConfig = field(default_factory=MoEConfig)  # experts (qwen3_moe), none when dense

    def validate(self) -> None:
        self.moe.validate()
        if self.head_size < 0:
            raise ValueError(f"model.head_size must be >= 0 (0: derived), got {self.head_size}")
        if not self.head_size and self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"model.hidden_size={self.hidden_size} must be divisible by "
                f"model.num_attention_heads={self.num_attention_heads}"
            )
        if self.num_attention_heads % self.num_query_groups:
            raise ValueError(
                f"model.num_attention_heads={self.num_attention_heads} must be divisible by "
                f"model.num_query_groups={self.num_query_groups}"
            )
        for name in ("num_layers", "hidden_size", "ffn_hidden_size", "vocab_size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"model.{name} must be > 0, got {getattr(self, name)}")
        moe_arch = self.arch.endswith("_moe")
        if moe_arch != (self.moe.num_experts > 0):
            raise ValueError(
                f"model.arch={self.arch} with model.moe.num_experts={self.moe.num_experts}: "
                "MoE architectures (qwen3_moe, qwen2_moe) need num_experts > 0, dense ones 0"
            )

    @property
    def head_dim(self) -> int:
        """Width of one attention head (HF ``head_dim``, Megatron ``kv_channels``)."""
        return self.head_size or self.hidden_size // self.num_attention_heads

    @property
    def is_moe(self) -> bool:
        return self.moe.num_experts > 0


@dataclass
class OptimizerConfig:
    """AdamW settings of a trainable :class:`~megatron_rl.model.policy.Policy`.

    The trainer's ``TrainConfig`` extends this with step counts and schedules; the model only
    reads these fields, so it never imports the trainer.
    """

    lr: float = 1e-3  # peak learning rate (the trainer passes the scheduled one every step)
    weight_decay: float = 0.0  # AdamW decoupled weight decay (matrices only: not biases, norms)
    adam_beta1: float = 0.9  # Adam beta1
    adam_beta2: float = 0.95  # Adam beta2
    adam_eps: float = 1e-8  # Adam epsilon
    grad_clip: float = 1.0  # max global grad norm (0: off)


@dataclass
class ParallelConfig:
    """How the policy is split over processes (world = tp * pp * cp * dp).

    Experts are split on their own grid over the same processes: ``ep`` ranks each hold
    ``num_experts / ep`` experts, each expert split over ``etp`` ranks; what is left of the world
    replicates them (expert data parallelism, ``world / (ep * etp * pp)``).
    """

    tp: int = 1  # tensor-parallel degree
    pp: int = 1  # pipeline-parallel degree
    cp: int = 1  # context-parallel degree (TE attention on GPU, long_context/cp_attention on CPU)
    dp: int = 0  # data-parallel degree; 0: derived (world / (tp * pp * cp)), else must match it
    ep: int = 1  # expert-parallel degree (MoE models): experts split over ep ranks
    etp: int = 0  # tensor-parallel degree inside one expert: 1 or tp (0: tp, Megatron's default)
    # with cp > 1: micro-batches whose sequences are all shorter than this many tokens run whole,
    # one per CP rank (below it the CP group works as data parallelism; model/cp/switch.py);
    # 0: every micro-batch is split over the CP group
    cp_min_tokens: int = 0
    backend: Literal["auto", "gloo", "nccl"] = "auto"  # auto: nccl with CUDA, else gloo

    def validate(self) -> None:
        for name in ("tp", "pp", "cp", "ep"):
            if getattr(self, name) < 1:
                raise ValueError(f"parallel.{name} must be >= 1, got {getattr(self, name)}")
        if self.dp < 0:
            raise ValueError(f"parallel.dp must be >= 0 (0: derived), got {self.dp}")
        if self.cp_min_tokens < 0:
            raise ValueError(f"parallel.cp_min_tokens must be >= 0, got {self.cp_min_tokens}")
        if self.cp_min_tokens > 0 and self.pp > 1:
            raise ValueError(
                f"parallel.cp_min_tokens={self.cp_min_tokens} needs parallel.pp=1 (whole "
                f"micro-batches are shared out inside one pipeline stage), got pp={self.pp}"
            )
        if self.etp not in (0, 1, self.tp):
            raise ValueError(
                f"parallel.etp={self.etp} is not supported; choose 0 (= tp), 1 or "
                f"parallel.tp={self.tp}"
            )
        from megatron_rl.model.cp.shard import check_cp_supported

        check_cp_supported(self.cp)  # cp > 1 on GPU needs Transformer Engine

    @property
    def expert_tp(self) -> int:
        """The tensor-parallel degree inside one expert (``etp``, 0 meaning ``tp``)."""
        return self.etp or self.tp
