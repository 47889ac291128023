"""Policy architecture and parallel layout."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass
class ModelConfig:
    """A GPT of Llama / Qwen2 shape (RMSNorm, SwiGLU, RoPE, GQA)."""

    arch: Literal["qwen2", "llama"] = "qwen2"  # HF architecture family used for conversion
    hf_path: str | None = None  # HF-layout checkpoint to start from (None: random init)
    num_layers: int = 4  # transformer blocks
    hidden_size: int = 256  # model width
    ffn_hidden_size: int = 768  # SwiGLU inner width
    num_attention_heads: int = 4  # query heads (head size = hidden_size / heads)
    num_query_groups: int = 2  # key/value heads (GQA); == heads for plain MHA
    vocab_size: int = 384  # embedding rows (padded tokenizer size)
    max_position_embeddings: int = 2048  # longest sequence, tokens
    rotary_base: float = 10000.0  # RoPE theta
    norm_epsilon: float = 1e-6  # RMSNorm epsilon
    qkv_bias: bool = True  # bias on the QKV projection (Qwen2: true, Llama: false)
    tie_embeddings: bool = False  # share input embedding and output layer
    init_std: float = 0.02  # std of the random init
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"  # parameter/compute dtype
    recompute: Literal["none", "selective", "full"] = "none"  # activation recomputation

    def validate(self) -> None:
        if self.hidden_size % self.num_attention_heads:
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

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


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
    """How the policy is split over processes (world = tp * pp * cp * dp)."""

    tp: int = 1  # tensor-parallel degree
    pp: int = 1  # pipeline-parallel degree
    cp: int = 1  # context-parallel degree (TE attention on GPU, long_context/cp_attention on CPU)
    dp: int = 0  # data-parallel degree; 0: derived (world / (tp * pp * cp)), else must match it
    # with cp > 1: micro-batches whose sequences are all shorter than this many tokens run whole,
    # one per CP rank (below it the CP group works as data parallelism; long_context/cp_switch.py);
    # 0: every micro-batch is split over the CP group
    cp_min_tokens: int = 0
    backend: Literal["auto", "gloo", "nccl"] = "auto"  # auto: nccl with CUDA, else gloo

    def validate(self) -> None:
        for name in ("tp", "pp", "cp"):
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
        from long_context.cp import check_cp_supported

        check_cp_supported(self.cp)  # cp > 1 on GPU needs Transformer Engine
