"""HF <-> Megatron weight conversion for Llama / Qwen2 shaped models, as pure state-dict functions.

One converter serves both the ``megatron-rl convert`` command and weight sync to the rollout
engines, so it works on state dicts only (no ``torch.distributed``) and moves tensors with views,
``chunk`` and ``cat`` (never per-element Python work).

Megatron ``GPTModel.state_dict()`` layout produced for one (tp_rank, pp_rank):

* ``embedding.word_embeddings.weight``: vocab-parallel, rows split over TP (first PP stage).
* ``decoder.layers.{i}.self_attention.linear_qkv.weight`` (and ``.bias``): fused QKV in Megatron's
  grouped layout. For each key/value group g the rows are the group's query heads, then its key
  head, then its value head; TP ranks own contiguous runs of groups. Shape per rank:
  ``[(groups / tp) * (heads / groups + 2) * head_dim, hidden]``.
* ``...self_attention.linear_proj.weight``: row parallel (columns split), ``[hidden, hidden / tp]``.
* ``...mlp.linear_fc1.weight``: SwiGLU gate and up fused, each TP rank holding its gate rows then
  its up rows, ``[2 * ffn / tp, hidden]``. ``...mlp.linear_fc2.weight``: row parallel.
* RMSNorm weights are replicated. The local spec names them ``input_layernorm`` /
  ``pre_mlp_layernorm``; the Transformer Engine spec fuses them into the following linear layer as
  ``linear_qkv.layer_norm_weight`` / ``linear_fc1.layer_norm_weight``. ``spec=`` picks the naming on
  the way in; the way out accepts both.
* ``decoder.final_layernorm.weight`` and ``output_layer.weight`` (vocab-parallel) on the last stage.
  With tied embeddings there is no output layer at PP=1; at PP>1 Megatron keeps a copy of the
  embedding on the last stage as ``output_layer.weight``, and so do we.
* Layers are numbered locally within a PP stage (stage s of p holds global layers
  ``s * L/p .. (s+1) * L/p - 1`` as ``decoder.layers.0..``), as ``GPTModel.state_dict()`` does.
* ``_extra_state`` entries (Transformer Engine FP8 metadata) carry no weights and are skipped.

RoPE needs no permutation: HF Llama/Qwen2 and Megatron (``rotary_interleaved=False``) both rotate
halves. Megatron pads the vocabulary to a multiple of TP; we do not: ``ModelConfig.vocab_size`` is
already the padded size and TP must divide it (checked with a clear error instead).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Literal

import torch
from torch import Tensor

from megatron_rl.model.config import ModelConfig

Spec = Literal["local", "te"]
SPECS: tuple[str, ...] = ("local", "te")

_EMB = "embedding.word_embeddings.weight"
_OUT = "output_layer.weight"
_FINAL_NORM = "decoder.final_layernorm.weight"
# Megatron name of each per-layer norm, by spec.
_NORM_NAMES: dict[str, tuple[str, str]] = {
    "local": ("input_layernorm.weight", "pre_mlp_layernorm.weight"),
    "te": ("self_attention.linear_qkv.layer_norm_weight", "mlp.linear_fc1.layer_norm_weight"),
}


def check_layout(cfg: ModelConfig, tp: int, pp: int) -> None:
    """Raise a one-line ``ValueError`` when ``tp``/``pp`` cannot split ``cfg``."""
    if tp < 1 or pp < 1:
        raise ValueError(f"tp and pp must be >= 1, got tp={tp} pp={pp}")
    divisible = {
        "num_attention_heads": cfg.num_attention_heads,
        "num_query_groups": cfg.num_query_groups,
        "ffn_hidden_size": cfg.ffn_hidden_size,
        "vocab_size": cfg.vocab_size,
    }
    for name, value in divisible.items():
        if value % tp:
            raise ValueError(f"tp={tp} must divide {name}={value}; choose tp among its divisors")
    if cfg.num_layers % pp:
        raise ValueError(
            f"pp={pp} must divide num_layers={cfg.num_layers}; choose pp among its divisors"
        )


def stage_layers(cfg: ModelConfig, pp: int, pp_rank: int) -> range:
    """Global layer indices held by pipeline stage ``pp_rank`` of ``pp``."""
    per = cfg.num_layers // pp
    return range(pp_rank * per, (pp_rank + 1) * per)


# ----------------------------------------------------------------------------------------------
# HF -> Megatron


def _qkv_grouped(q: Tensor, k: Tensor, v: Tensor, cfg: ModelConfig) -> Tensor:
    """Fuse HF q/k/v (``[heads*d, ...]``, ``[groups*d, ...]`` x2) into ``[groups, rows, ...]``.

    Returns ``[groups, (heads/groups + 2) * d, *rest]`` (rest = ``[hidden]`` or ``[]`` for bias).
    """
    g, d = cfg.num_query_groups, cfg.head_dim
    rest = q.shape[1:]
    qg = q.view(g, (cfg.num_attention_heads // g) * d, *rest)
    return torch.cat([qg, k.view(g, d, *rest), v.view(g, d, *rest)], dim=1)


def _tp_chunk(t: Tensor, tp: int, tp_rank: int, dim: int) -> Tensor:
    return t.chunk(tp, dim=dim)[tp_rank] if tp > 1 else t


def _layer_to_megatron(
    hf_sd: dict[str, Tensor], cfg: ModelConfig, i: int, tp: int, tp_rank: int, spec: Spec
) -> dict[str, Tensor]:
    """Megatron tensors (names without the ``decoder.layers.{j}.`` prefix) of HF layer ``i``."""
    h = f"model.layers.{i}."
    out: dict[str, Tensor] = {}
    attn_norm, mlp_norm = _NORM_NAMES[spec]
    out[attn_norm] = hf_sd[h + "input_layernorm.weight"]
    out[mlp_norm] = hf_sd[h + "post_attention_layernorm.weight"]
    a = h + "self_attn."
    qkv = _qkv_grouped(hf_sd[a + "q_proj.weight"], hf_sd[a + "k_proj.weight"],
                       hf_sd[a + "v_proj.weight"], cfg)  # fmt: skip
    out["self_attention.linear_qkv.weight"] = _tp_chunk(qkv, tp, tp_rank, 0).reshape(
        -1, cfg.hidden_size
    )
    if cfg.qkv_bias:
        bias = _qkv_grouped(hf_sd[a + "q_proj.bias"], hf_sd[a + "k_proj.bias"],
                            hf_sd[a + "v_proj.bias"], cfg)  # fmt: skip
        out["self_attention.linear_qkv.bias"] = _tp_chunk(bias, tp, tp_rank, 0).reshape(-1)
    out["self_attention.linear_proj.weight"] = _tp_chunk(hf_sd[a + "o_proj.weight"], tp, tp_rank, 1)
    m = h + "mlp."
    gate = _tp_chunk(hf_sd[m + "gate_proj.weight"], tp, tp_rank, 0)
    up = _tp_chunk(hf_sd[m + "up_proj.weight"], tp, tp_rank, 0)
    out["mlp.linear_fc1.weight"] = torch.cat([gate, up], dim=0)
    out["mlp.linear_fc2.weight"] = _tp_chunk(hf_sd[m + "down_proj.weight"], tp, tp_rank, 1)
    return out


def hf_to_megatron_rank(
    hf_sd: dict[str, Tensor],
    cfg: ModelConfig,
    tp: int = 1,
    tp_rank: int = 0,
    pp: int = 1,
    pp_rank: int = 0,
    spec: Spec = "local",
) -> dict[str, Tensor]:
    """The ``GPTModel.state_dict()`` shard of rank (``tp_rank``, ``pp_rank``) from an HF state dict.

    ``hf_sd`` uses HF Llama/Qwen2 names (``model.layers.{i}.self_attn.q_proj.weight``, ...).
    Returned tensors may be views of ``hf_sd`` (no copy where the layout allows); call
    ``.contiguous()`` before writing them if needed (the safetensors I/O here does).
    """
    check_layout(cfg, tp, pp)
    if spec not in SPECS:
        raise ValueError(f"unknown Megatron layer spec {spec!r}; choose one of {list(SPECS)}")
    out: dict[str, Tensor] = {}
    first, last = pp_rank == 0, pp_rank == pp - 1
    if first:
        out[_EMB] = _tp_chunk(hf_sd["model.embed_tokens.weight"], tp, tp_rank, 0)
    for local, i in enumerate(stage_layers(cfg, pp, pp_rank)):
        for name, t in _layer_to_megatron(hf_sd, cfg, i, tp, tp_rank, spec).items():
            out[f"decoder.layers.{local}.{name}"] = t
    if last:
        out[_FINAL_NORM] = hf_sd["model.norm.weight"]
        if not cfg.tie_embeddings:
            out[_OUT] = _tp_chunk(hf_sd["lm_head.weight"], tp, tp_rank, 0)
        elif pp > 1:
            out[_OUT] = _tp_chunk(hf_sd["model.embed_tokens.weight"], tp, tp_rank, 0)
    return out


def hf_to_megatron(
    hf_sd: dict[str, Tensor], cfg: ModelConfig, tp: int = 1, pp: int = 1, spec: Spec = "local"
) -> dict[tuple[int, int], dict[str, Tensor]]:
    """All shards, keyed ``(tp_rank, pp_rank)``."""
    return {
        (t, p): hf_to_megatron_rank(hf_sd, cfg, tp, t, pp, p, spec)
        for p in range(pp)
        for t in range(tp)
    }


# ----------------------------------------------------------------------------------------------
# Megatron -> HF


def megatron_shard_shapes(cfg: ModelConfig, tp: int, pp: int, pp_rank: int) -> dict[str, tuple]:
    """Name -> shape of every tensor of one TP rank of stage ``pp_rank`` (both spec namings).

    Computed by converting ``meta``-device tensors, so it costs no memory and cannot disagree
    with :func:`hf_to_megatron_rank`.
    """
    meta = {n: torch.empty(s, device="meta") for n, s in hf_param_shapes(cfg).items()}
    shapes: dict[str, tuple] = {}
    for spec in SPECS:
        shard = hf_to_megatron_rank(meta, cfg, tp, 0, pp, pp_rank, spec)  # type: ignore[arg-type]
        shapes.update({n: tuple(t.shape) for n, t in shard.items()})
    return shapes


class _Shards:
    """Reads named tensors from one PP stage's TP shards and records what was consumed."""

    def __init__(
        self,
        shards: dict[tuple[int, int], dict[str, Tensor]],
        cfg: ModelConfig,
        tp: int,
        pp: int,
        pp_rank: int,
    ):
        missing = [t for t in range(tp) if (t, pp_rank) not in shards]
        if missing:
            raise ValueError(f"missing Megatron shard(s) (tp_rank, pp_rank): "
                             f"{[(t, pp_rank) for t in missing]}")  # fmt: skip
        self.ranks = [shards[(t, pp_rank)] for t in range(tp)]
        self.pp_rank = pp_rank
        self.used: set[str] = set()
        self.shapes = megatron_shard_shapes(cfg, tp, pp, pp_rank)

    def has(self, name: str) -> bool:
        return name in self.ranks[0]

    def get(self, name: str) -> list[Tensor]:
        """The tensor ``name`` from every TP rank of this stage (rank order)."""
        try:
            parts = [r[name] for r in self.ranks]
        except KeyError:
            raise ValueError(
                f"Megatron shard of pipeline stage {self.pp_rank} has no tensor {name!r}"
            ) from None
        for tp_rank, t in enumerate(parts):
            if tuple(t.shape) != self.shapes[name]:
                raise ValueError(
                    f"Megatron shard (tp_rank={tp_rank}, pp_rank={self.pp_rank}): tensor {name!r} "
                    f"has shape {tuple(t.shape)}, the config implies {self.shapes[name]}"
                )
        self.used.add(name)
        return parts

    def one(self, name: str) -> Tensor:
        """A replicated tensor (taken from TP rank 0)."""
        return self.get(name)[0]

    def unused(self) -> list[str]:
        names: Iterable[str] = (n for r in self.ranks for n in r)
        return sorted({n for n in names if n not in self.used and not n.endswith("_extra_state")})


def _cat(parts: list[Tensor], dim: int) -> Tensor:
    """``torch.cat`` that returns a lone part as is (TP=1: no copy)."""
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=dim)


def _split_qkv(parts: list[Tensor], cfg: ModelConfig) -> tuple[Tensor, Tensor, Tensor]:
    """Inverse of :func:`_qkv_grouped` over TP parts: fused rows -> HF q, k, v."""
    d, local_groups = cfg.head_dim, cfg.num_query_groups // len(parts)
    per_group = (cfg.num_attention_heads // cfg.num_query_groups) * d
    rest = parts[0].shape[1:]
    # Split each rank's [groups/tp, rows, ...] view first, then one cat per q/k/v: one copy.
    split = [p.view(local_groups, per_group + 2 * d, *rest).split([per_group, d, d], 1)
             for p in parts]  # fmt: skip
    q, k, v = (_cat([s[i] for s in split], 0).reshape(-1, *rest) for i in range(3))
    return q, k, v


def _layer_to_hf(st: _Shards, cfg: ModelConfig, local: int, i: int) -> dict[str, Tensor]:
    """HF tensors of global layer ``i`` from local layer ``local`` of stage ``st``."""
    m, h = f"decoder.layers.{local}.", f"model.layers.{i}."
    spec = "te" if st.has(m + _NORM_NAMES["te"][0]) else "local"
    attn_norm, mlp_norm = _NORM_NAMES[spec]
    out = {
        h + "input_layernorm.weight": st.one(m + attn_norm),
        h + "post_attention_layernorm.weight": st.one(m + mlp_norm),
    }
    a = h + "self_attn."
    q, k, v = _split_qkv(st.get(m + "self_attention.linear_qkv.weight"), cfg)
    out.update({a + "q_proj.weight": q, a + "k_proj.weight": k, a + "v_proj.weight": v})
    if cfg.qkv_bias:
        q, k, v = _split_qkv(st.get(m + "self_attention.linear_qkv.bias"), cfg)
        out.update({a + "q_proj.bias": q, a + "k_proj.bias": k, a + "v_proj.bias": v})
    out[a + "o_proj.weight"] = _cat(st.get(m + "self_attention.linear_proj.weight"), 1)
    fc1 = [p.chunk(2, dim=0) for p in st.get(m + "mlp.linear_fc1.weight")]
    out[h + "mlp.gate_proj.weight"] = _cat([gu[0] for gu in fc1], 0)
    out[h + "mlp.up_proj.weight"] = _cat([gu[1] for gu in fc1], 0)
    out[h + "mlp.down_proj.weight"] = _cat(st.get(m + "mlp.linear_fc2.weight"), 1)
    return out


def megatron_to_hf(
    shards: dict[tuple[int, int], dict[str, Tensor]], cfg: ModelConfig, tp: int = 1, pp: int = 1
) -> dict[str, Tensor]:
    """Merge Megatron shards (keyed ``(tp_rank, pp_rank)``) into one HF Llama/Qwen2 state dict.

    Returned tensors may be views of the shards (at TP=1 most are). Either layer-spec naming is
    accepted. A tensor the HF model has no place for raises a
    ``ValueError`` naming it (``_extra_state`` entries are skipped). With tied embeddings no
    ``lm_head.weight`` is returned (HF re-ties it on load; weight sync adds it where needed).
    """
    check_layout(cfg, tp, pp)
    out: dict[str, Tensor] = {}
    for p in range(pp):
        st = _Shards(shards, cfg, tp, pp, p)
        if p == 0:
            out["model.embed_tokens.weight"] = _cat(st.get(_EMB), 0)
        for local, i in enumerate(stage_layers(cfg, pp, p)):
            out.update(_layer_to_hf(st, cfg, local, i))
        if p == pp - 1:
            out["model.norm.weight"] = st.one(_FINAL_NORM)
            if not cfg.tie_embeddings:
                out["lm_head.weight"] = _cat(st.get(_OUT), 0)
            elif st.has(_OUT):
                st.get(_OUT)  # the last stage's copy of the tied embedding
        extra = st.unused()
        if extra:
            raise ValueError(
                f"Megatron shard of pipeline stage {p} has tensor(s) with no HF counterpart "
                f"for this config: {extra[:5]}"
            )
    return out


def stage_part_to_hf(
    parts: list[dict[str, Tensor]], cfg: ModelConfig, tp: int, pp: int, pp_rank: int
) -> dict[str, Tensor]:
    """HF tensors of a *part* of one PP stage: whole units (embedding, layers, final norm/output).

    ``parts[t]`` holds TP rank ``t``'s tensors of those units (the same names on every rank).
    Used to stream a model out bucket by bucket (``megatron_rl.model.export``) instead of
    merging every stage at once as :func:`megatron_to_hf` does.
    """
    st = _Shards({(t, pp_rank): parts[t] for t in range(tp)}, cfg, tp, pp, pp_rank)
    out: dict[str, Tensor] = {}
    if st.has(_EMB):
        out["model.embed_tokens.weight"] = _cat(st.get(_EMB), 0)
    for local, i in enumerate(stage_layers(cfg, pp, pp_rank)):
        if any(k.startswith(f"decoder.layers.{local}.") for k in parts[0]):
            out.update(_layer_to_hf(st, cfg, local, i))
    if st.has(_FINAL_NORM):
        out["model.norm.weight"] = st.one(_FINAL_NORM)
    if st.has(_OUT):
        tensors = st.get(_OUT)
        if not cfg.tie_embeddings:
            out["lm_head.weight"] = _cat(tensors, 0)
    extra = st.unused()
    if extra:
        raise ValueError(
            f"Megatron shard of pipeline stage {pp_rank} has tensor(s) with no HF counterpart "
            f"for this config: {extra[:5]}"
        )
    return out


def stage_units(names: list[str]) -> list[list[str]]:
    """A stage's Megatron names in order, grouped into units that convert on their own.

    One unit per transformer layer (``decoder.layers.<i>.*``); every other tensor is its own unit.
    """
    units: list[list[str]] = []
    key_of: dict[str, int] = {}
    for n in names:
        m = re.match(r"decoder\.layers\.(\d+)\.", n)
        key = m.group(0) if m else n
        if key not in key_of:
            key_of[key] = len(units)
            units.append([])
        units[key_of[key]].append(n)
    return units


def hf_param_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor of the HF model described by ``cfg`` (used to validate)."""
    hd, d = cfg.hidden_size, cfg.head_dim
    q_rows, kv_rows = cfg.num_attention_heads * d, cfg.num_query_groups * d
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (cfg.vocab_size, hd)}
    for i in range(cfg.num_layers):
        h = f"model.layers.{i}."
        shapes.update({
            h + "input_layernorm.weight": (hd,),
            h + "post_attention_layernorm.weight": (hd,),
            h + "self_attn.q_proj.weight": (q_rows, hd),
            h + "self_attn.k_proj.weight": (kv_rows, hd),
            h + "self_attn.v_proj.weight": (kv_rows, hd),
            h + "self_attn.o_proj.weight": (hd, q_rows),
            h + "mlp.gate_proj.weight": (cfg.ffn_hidden_size, hd),
            h + "mlp.up_proj.weight": (cfg.ffn_hidden_size, hd),
            h + "mlp.down_proj.weight": (hd, cfg.ffn_hidden_size),
        })  # fmt: skip
        if cfg.qkv_bias:
            shapes.update({h + "self_attn.q_proj.bias": (q_rows,),
                           h + "self_attn.k_proj.bias": (kv_rows,),
                           h + "self_attn.v_proj.bias": (kv_rows,)})  # fmt: skip
    shapes["model.norm.weight"] = (hd,)
    if not cfg.tie_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, hd)
    return shapes


def check_hf_state_dict(hf_sd: dict[str, Tensor], cfg: ModelConfig, where: str) -> None:
    """Raise a one-line ``ValueError`` (naming ``where``) on missing, extra or mis-shaped tensors.

    A tied model's ``lm_head.weight`` and RoPE ``inv_freq`` buffers are tolerated as extras.
    """
    shapes = hf_param_shapes(cfg)
    missing = [n for n in shapes if n not in hf_sd]
    if missing:
        raise ValueError(f"{where}: missing tensor(s) {missing[:3]} ({len(missing)} missing)")
    for name, shape in shapes.items():
        if tuple(hf_sd[name].shape) != shape:
            raise ValueError(
                f"{where}: tensor {name!r} has shape {tuple(hf_sd[name].shape)}, "
                f"config.json implies {shape}"
            )
    tolerated = ("lm_head.weight",) if cfg.tie_embeddings else ()
    extra = sorted(
        n for n in hf_sd if n not in shapes and n not in tolerated and "inv_freq" not in n
    )
    if extra:
        raise ValueError(f"{where}: unexpected tensor(s) for this config: {extra[:3]}")
