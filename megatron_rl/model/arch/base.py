"""The dense decoder family every architecture here starts from (Llama / Qwen2 shape).

A *family* ties one HF architecture (``config.json``'s ``architectures[0]``) to the Megatron GPT
that computes the same function, in three places: the ``config.json`` <-> :class:`ModelConfig`
mapping (what it refuses, too), the layer-spec options of ``gpt.py``, and the per-layer tensors
of the HF <-> Megatron converter (``convert.py`` runs the embedding, stage split, output layer
and checks; a family converts one transformer layer). Subclasses override the part that differs:
Qwen2 adds the QKV bias, Qwen3 the q/k RMSNorm, Qwen3-MoE the experts and the router.

Megatron names of one layer (local spec; the TE spec fuses the two norms into the next linear
as ``linear_qkv.layer_norm_weight`` / ``linear_fc1.layer_norm_weight``):

* ``self_attention.linear_qkv.weight`` (and ``.bias``): fused QKV in Megatron's grouped layout.
  For each key/value group g the rows are the group's query heads, then its key head, then its
  value head; TP ranks own contiguous runs of groups. Shape per rank:
  ``[(groups / tp) * (heads / groups + 2) * head_dim, hidden]``.
* ``self_attention.linear_proj.weight``: row parallel (columns split), ``[hidden, q_rows / tp]``.
* ``mlp.linear_fc1.weight``: SwiGLU gate and up fused, each TP rank holding its gate rows then
  its up rows, ``[2 * ffn / tp, hidden]``. ``mlp.linear_fc2.weight``: row parallel.
* RMSNorm weights are replicated over TP.

RoPE needs no permutation: HF Llama/Qwen and Megatron (``rotary_interleaved=False``) both rotate
halves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol

import torch
from torch import Tensor

from megatron_rl.model.config import ModelConfig

Spec = Literal["local", "te"]
SPECS: tuple[str, ...] = ("local", "te")
DTYPES = ("float32", "bfloat16", "float16")
# Megatron name of each per-layer norm, by spec.
NORM_NAMES: dict[str, tuple[str, str]] = {
    "local": ("input_layernorm.weight", "pre_mlp_layernorm.weight"),
    "te": ("self_attention.linear_qkv.layer_norm_weight", "mlp.linear_fc1.layer_norm_weight"),
}


@dataclass(frozen=True)
class RankShard:
    """Which slice of the model one rank holds: its TP rank and, for experts, its EP rank.

    ``etp`` (1 or ``tp``) splits each expert: with ``etp == tp`` a rank holds TP slice
    ``tp_rank`` of its experts, with ``etp == 1`` whole experts.
    """

    tp: int = 1  # tensor-parallel degree
    tp_rank: int = 0
    ep: int = 1  # expert-parallel degree
    ep_rank: int = 0
    etp: int = 1  # tensor-parallel degree inside an expert (1 or tp)

    @property
    def etp_rank(self) -> int:
        return self.tp_rank if self.etp > 1 else 0


class ShardReader(Protocol):
    """What a family reads Megatron tensors through (``convert._Shards``)."""

    def has(self, name: str) -> bool: ...

    def get(self, name: str) -> list[Tensor]:
        """The tensor from every TP rank of the stage, in rank order (shape-checked)."""
        ...

    def one(self, name: str) -> Tensor:
        """A tensor replicated over TP (rank 0's)."""
        ...

    def experts(self, name: str) -> list[list[Tensor]]:
        """An expert tensor from every EP rank (outer) and expert-TP rank (inner)."""
        ...


def tp_chunk(t: Tensor, tp: int, tp_rank: int, dim: int) -> Tensor:
    """TP rank ``tp_rank``'s slice of ``t`` along ``dim`` (a view; ``t`` itself when tp == 1)."""
    return t.chunk(tp, dim=dim)[tp_rank] if tp > 1 else t


def cat(parts: list[Tensor], dim: int) -> Tensor:
    """``torch.cat`` that returns a lone part as is (TP=1: no copy)."""
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=dim)


def rope_theta(config: dict[str, Any]) -> float:
    """RoPE base from ``rope_theta`` (transformers 4) or ``rope_parameters`` (transformers 5)."""
    params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type != "default":
        raise ValueError(f"RoPE scaling {rope_type!r} is not supported; only plain RoPE is")
    return float(params.get("rope_theta", config.get("rope_theta", 10000.0)))


class DenseFamily:
    """A decoder of RMSNorm, grouped-query attention with RoPE and a SwiGLU MLP, no biases."""

    arch = ""  # ModelConfig.arch
    hf_class = ""  # HF architectures[0]
    model_type = ""  # HF model_type
    qkv_bias = False  # the HF architecture biases q/k/v (and nothing else)
    qk_norm = False  # RMSNorm on every query / key head before RoPE
    free_head_dim = False  # HF head_dim may differ from hidden_size / num_attention_heads

    # ------------------------------------------------------------------ config.json

    def refuse(self, config: dict[str, Any]) -> None:
        """Raise a one-line ``ValueError`` for settings this Megatron model cannot express."""
        if config.get("hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act={config['hidden_act']!r} is not supported; only 'silu'")
        heads = config["num_attention_heads"]
        if not self.free_head_dim and config.get("head_dim") not in (
            None,
            config["hidden_size"] // heads,
        ):
            raise ValueError(
                f"head_dim={config['head_dim']} != hidden_size / num_attention_heads "
                "is not supported"
            )

    def config_fields(self, config: dict[str, Any]) -> dict[str, Any]:
        """:class:`ModelConfig` keyword arguments read from an HF ``config.json`` dict."""
        dtype = config.get("dtype") or config.get("torch_dtype") or "float32"
        heads = int(config["num_attention_heads"])
        head_size = int(config.get("head_dim") or 0) if self.free_head_dim else 0
        return dict(
            arch=self.arch,
            num_layers=int(config["num_hidden_layers"]),
            hidden_size=int(config["hidden_size"]),
            ffn_hidden_size=int(config["intermediate_size"]),
            num_attention_heads=heads,
            num_query_groups=int(config.get("num_key_value_heads") or heads),
            head_size=head_size,
            vocab_size=int(config["vocab_size"]),
            max_position_embeddings=int(config.get("max_position_embeddings", 2048)),
            rotary_base=rope_theta(config),
            norm_epsilon=float(config.get("rms_norm_eps", 1e-6)),
            qkv_bias=self.qkv_bias,
            tie_embeddings=bool(config.get("tie_word_embeddings", False)),
            init_std=float(config.get("initializer_range", 0.02)),
            dtype=dtype if dtype in DTYPES else "float32",
        )

    def check_writable(self, cfg: ModelConfig) -> None:
        """Raise if ``cfg`` has a setting this HF architecture cannot hold."""
        if cfg.qkv_bias != self.qkv_bias:
            raise ValueError(
                f"model.qkv_bias={cfg.qkv_bias} cannot be written as {self.hf_class}"
                f" (its QKV bias is always {str(self.qkv_bias).lower()}; HF "
                "attention_bias would also bias o_proj)"
            )

    def hf_fields(self, cfg: ModelConfig) -> dict[str, Any]:
        """The ``config.json`` keys this family sets (the caller keeps every other base key)."""
        return {
            "architectures": [self.hf_class],
            "model_type": self.model_type,
            "hidden_act": "silu",
            "hidden_size": cfg.hidden_size,
            "intermediate_size": cfg.ffn_hidden_size,
            "num_attention_heads": cfg.num_attention_heads,
            "num_key_value_heads": cfg.num_query_groups,
            "num_hidden_layers": cfg.num_layers,
            "head_dim": cfg.head_dim,
            "rms_norm_eps": cfg.norm_epsilon,
            "rope_theta": cfg.rotary_base,
            "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rotary_base},
            "vocab_size": cfg.vocab_size,
            "max_position_embeddings": cfg.max_position_embeddings,
            "tie_word_embeddings": cfg.tie_embeddings,
            "initializer_range": cfg.init_std,
            "torch_dtype": cfg.dtype,
            "dtype": cfg.dtype,
            "attention_dropout": 0.0,
            "use_cache": True,
        }

    def drop_hf_keys(self) -> tuple[str, ...]:
        """Base ``config.json`` keys that would be stale or contradict ours."""
        return ("rope_scaling",)

    def norm_names(self, spec: str) -> tuple[str, str]:
        """Megatron names of a layer's attention and MLP input norms under ``spec``."""
        return NORM_NAMES[spec]

    # ------------------------------------------------------------------ layer spec

    def spec_options(self, cfg: ModelConfig) -> dict[str, Any]:
        """Keyword arguments of megatron-core's GPT layer-spec builders for this family."""
        return {"qk_layernorm": self.qk_norm}

    # ------------------------------------------------------------------ HF tensors

    def layer_shapes(self, cfg: ModelConfig, i: int) -> dict[str, tuple[int, ...]]:
        """HF name -> shape of every tensor of layer ``i``."""
        h, hd = f"model.layers.{i}.", cfg.hidden_size
        q_rows, kv_rows = (
            cfg.num_attention_heads * cfg.head_dim,
            cfg.num_query_groups * cfg.head_dim,
        )
        a = h + "self_attn."
        shapes: dict[str, tuple[int, ...]] = {
            h + "input_layernorm.weight": (hd,),
            h + "post_attention_layernorm.weight": (hd,),
            a + "q_proj.weight": (q_rows, hd),
            a + "k_proj.weight": (kv_rows, hd),
            a + "v_proj.weight": (kv_rows, hd),
            a + "o_proj.weight": (hd, q_rows),
        }
        if cfg.qkv_bias:
            shapes.update(
                {
                    a + "q_proj.bias": (q_rows,),
                    a + "k_proj.bias": (kv_rows,),
                    a + "v_proj.bias": (kv_rows,),
                }
            )
        shapes.update(self.mlp_shapes(cfg, i))
        return shapes

    def mlp_shapes(self, cfg: ModelConfig, i: int) -> dict[str, tuple[int, ...]]:
        m, hd, ffn = f"model.layers.{i}.mlp.", cfg.hidden_size, cfg.ffn_hidden_size
        return {
            m + "gate_proj.weight": (ffn, hd),
            m + "up_proj.weight": (ffn, hd),
            m + "down_proj.weight": (hd, ffn),
        }

    # ------------------------------------------------------------------ HF -> Megatron

    def layer_to_megatron(
        self, hf_sd: dict[str, Tensor], cfg: ModelConfig, i: int, rank: RankShard, spec: Spec
    ) -> dict[str, Tensor]:
        """Megatron tensors (names without ``decoder.layers.{j}.``) of HF layer ``i``."""
        h = f"model.layers.{i}."
        attn_norm, mlp_norm = self.norm_names(spec)
        out = {
            attn_norm: hf_sd[h + "input_layernorm.weight"],
            mlp_norm: hf_sd[h + "post_attention_layernorm.weight"],
        }
        out.update(self.attention_to_megatron(hf_sd, cfg, h + "self_attn.", rank))
        out.update(self.mlp_to_megatron(hf_sd, cfg, h + "mlp.", rank, spec))
        return out

    def attention_to_megatron(
        self, hf_sd: dict[str, Tensor], cfg: ModelConfig, a: str, rank: RankShard
    ) -> dict[str, Tensor]:
        tp, tp_rank = rank.tp, rank.tp_rank
        kinds = ("weight", "bias") if cfg.qkv_bias else ("weight",)
        out = {}
        for kind in kinds:
            q, k, v = (hf_sd[f"{a}{n}_proj.{kind}"] for n in "qkv")
            qkv = _qkv_grouped(q, k, v, cfg)
            shard = tp_chunk(qkv, tp, tp_rank, 0)
            out[f"self_attention.linear_qkv.{kind}"] = shard.reshape(-1, *qkv.shape[2:])
        out["self_attention.linear_proj.weight"] = tp_chunk(
            hf_sd[a + "o_proj.weight"], tp, tp_rank, 1
        )
        return out

    def mlp_to_megatron(
        self, hf_sd: dict[str, Tensor], cfg: ModelConfig, m: str, rank: RankShard, spec: Spec
    ) -> dict[str, Tensor]:
        return swiglu_to_megatron(hf_sd, m, "mlp.", rank.tp, rank.tp_rank)

    # ------------------------------------------------------------------ Megatron -> HF

    def layer_to_hf(
        self, st: ShardReader, cfg: ModelConfig, local: int, i: int
    ) -> dict[str, Tensor]:
        """HF tensors of global layer ``i`` from local layer ``local`` of the stage ``st`` reads."""
        m, h = f"decoder.layers.{local}.", f"model.layers.{i}."
        spec = "te" if st.has(m + NORM_NAMES["te"][0]) else "local"
        attn_norm, mlp_norm = self.norm_names(spec)
        out = {
            h + "input_layernorm.weight": st.one(m + attn_norm),
            h + "post_attention_layernorm.weight": st.one(m + mlp_norm),
        }
        out.update(self.attention_to_hf(st, cfg, m, h + "self_attn."))
        out.update(self.mlp_to_hf(st, cfg, m, h + "mlp."))
        return out

    def attention_to_hf(
        self, st: ShardReader, cfg: ModelConfig, m: str, a: str
    ) -> dict[str, Tensor]:
        out = {}
        for kind in ("weight", "bias") if cfg.qkv_bias else ("weight",):
            q, k, v = _split_qkv(st.get(f"{m}self_attention.linear_qkv.{kind}"), cfg)
            out.update({f"{a}q_proj.{kind}": q, f"{a}k_proj.{kind}": k, f"{a}v_proj.{kind}": v})
        out[a + "o_proj.weight"] = cat(st.get(m + "self_attention.linear_proj.weight"), 1)
        return out

    def mlp_to_hf(self, st: ShardReader, cfg: ModelConfig, m: str, h: str) -> dict[str, Tensor]:
        return swiglu_to_hf(
            st.get(m + "mlp.linear_fc1.weight"), st.get(m + "mlp.linear_fc2.weight"), h
        )


# ----------------------------------------------------------------------------------------------
# tensor layouts shared by the families


def swiglu_to_megatron(
    hf_sd: dict[str, Tensor], h: str, m: str, tp: int, tp_rank: int
) -> dict[str, Tensor]:
    """HF ``{h}gate/up/down_proj`` -> Megatron ``{m}linear_fc1/linear_fc2`` of one TP rank."""
    gate = tp_chunk(hf_sd[h + "gate_proj.weight"], tp, tp_rank, 0)
    up = tp_chunk(hf_sd[h + "up_proj.weight"], tp, tp_rank, 0)
    return {
        m + "linear_fc1.weight": torch.cat([gate, up], dim=0),
        m + "linear_fc2.weight": tp_chunk(hf_sd[h + "down_proj.weight"], tp, tp_rank, 1),
    }


def swiglu_to_hf(fc1: list[Tensor], fc2: list[Tensor], h: str) -> dict[str, Tensor]:
    """Inverse of :func:`swiglu_to_megatron` over the TP parts of ``linear_fc1`` / ``fc2``."""
    halves = [p.chunk(2, dim=0) for p in fc1]
    return {
        h + "gate_proj.weight": cat([gu[0] for gu in halves], 0),
        h + "up_proj.weight": cat([gu[1] for gu in halves], 0),
        h + "down_proj.weight": cat(fc2, 1),
    }


def _qkv_grouped(q: Tensor, k: Tensor, v: Tensor, cfg: ModelConfig) -> Tensor:
    """Fuse HF q/k/v (``[heads*d, ...]``, ``[groups*d, ...]`` x2) into ``[groups, rows, ...]``.

    Returns ``[groups, (heads/groups + 2) * d, *rest]`` (rest = ``[hidden]`` or ``[]`` for bias).
    """
    g, d = cfg.num_query_groups, cfg.head_dim
    rest = q.shape[1:]
    qg = q.view(g, (cfg.num_attention_heads // g) * d, *rest)
    return torch.cat([qg, k.view(g, d, *rest), v.view(g, d, *rest)], dim=1)


def _split_qkv(parts: list[Tensor], cfg: ModelConfig) -> tuple[Tensor, Tensor, Tensor]:
    """Inverse of :func:`_qkv_grouped` over TP parts: fused rows -> HF q, k, v."""
    d, local_groups = cfg.head_dim, cfg.num_query_groups // len(parts)
    per_group = (cfg.num_attention_heads // cfg.num_query_groups) * d
    rest = parts[0].shape[1:]
    # Split each rank's [groups/tp, rows, ...] view first, then one cat per q/k/v: one copy.
    split = [
        p.view(local_groups, per_group + 2 * d, *rest).split([per_group, d, d], 1) for p in parts
    ]
    q, k, v = (cat([s[i] for s in split], 0).reshape(-1, *rest) for i in range(3))
    return q, k, v
