"""HF <-> Megatron weight conversion, as pure state-dict functions, for every model family.

One converter serves both the ``megatron-rl convert`` command and weight sync to the rollout
engines, so it works on state dicts only (no ``torch.distributed``) and moves tensors with views,
``chunk`` and ``cat`` (never per-element Python work). This module runs the parts every family
shares; one transformer layer's tensors are its family's (``megatron_rl/model/arch/``, where
the per-layer Megatron names and layouts are described).

Megatron ``GPTModel.state_dict()`` layout produced for one (tp_rank, pp_rank):

* ``embedding.word_embeddings.weight``: vocab-parallel, rows split over TP (first PP stage).
* ``decoder.layers.{i}.*``: the family's layer tensors (QKV grouped per query group, SwiGLU
  gate/up fused per TP rank, ...).
* ``decoder.final_layernorm.weight`` and ``output_layer.weight`` (vocab-parallel) on the last stage.
  With tied embeddings there is no output layer at PP=1; at PP>1 Megatron keeps a copy of the
  embedding on the last stage as ``output_layer.weight``, and so do we.
* Layers are numbered locally within a PP stage (stage s of p holds global layers
  ``s * L/p .. (s+1) * L/p - 1`` as ``decoder.layers.0..``), as ``GPTModel.state_dict()`` does.
* The local spec names the per-layer norms ``input_layernorm`` / ``pre_mlp_layernorm``; the
  Transformer Engine spec fuses them into the following linear layer. ``spec=`` picks the naming
  on the way in; the way out accepts both.
* ``_extra_state`` entries (Transformer Engine FP8 metadata) carry no weights and are skipped.

Megatron pads the vocabulary to a multiple of TP; we do not: ``ModelConfig.vocab_size`` is
already the padded size and TP must divide it (checked with a clear error instead).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import torch
from torch import Tensor

from megatron_rl.model.arch import family
from megatron_rl.model.arch.base import SPECS, Spec, cat, tp_chunk
from megatron_rl.model.config import ModelConfig

_EMB = "embedding.word_embeddings.weight"
_OUT = "output_layer.weight"
_FINAL_NORM = "decoder.final_layernorm.weight"


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

    ``hf_sd`` uses HF names (``model.layers.{i}.self_attn.q_proj.weight``, ...).
    Returned tensors may be views of ``hf_sd`` (no copy where the layout allows); call
    ``.contiguous()`` before writing them if needed (the safetensors I/O here does).
    """
    check_layout(cfg, tp, pp)
    if spec not in SPECS:
        raise ValueError(f"unknown Megatron layer spec {spec!r}; choose one of {list(SPECS)}")
    out: dict[str, Tensor] = {}
    first, last = pp_rank == 0, pp_rank == pp - 1
    if first:
        out[_EMB] = tp_chunk(hf_sd["model.embed_tokens.weight"], tp, tp_rank, 0)
    fam = family(cfg)
    for local, i in enumerate(stage_layers(cfg, pp, pp_rank)):
        for name, t in fam.layer_to_megatron(hf_sd, cfg, i, tp, tp_rank, spec).items():
            out[f"decoder.layers.{local}.{name}"] = t
    if last:
        out[_FINAL_NORM] = hf_sd["model.norm.weight"]
        if not cfg.tie_embeddings:
            out[_OUT] = tp_chunk(hf_sd["lm_head.weight"], tp, tp_rank, 0)
        elif pp > 1:
            out[_OUT] = tp_chunk(hf_sd["model.embed_tokens.weight"], tp, tp_rank, 0)
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


def megatron_to_hf(
    shards: dict[tuple[int, int], dict[str, Tensor]], cfg: ModelConfig, tp: int = 1, pp: int = 1
) -> dict[str, Tensor]:
    """Merge Megatron shards (keyed ``(tp_rank, pp_rank)``) into one HF state dict.

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
            out["model.embed_tokens.weight"] = cat(st.get(_EMB), 0)
        for local, i in enumerate(stage_layers(cfg, pp, p)):
            out.update(family(cfg).layer_to_hf(st, cfg, local, i))
        if p == pp - 1:
            out["model.norm.weight"] = st.one(_FINAL_NORM)
            if not cfg.tie_embeddings:
                out["lm_head.weight"] = cat(st.get(_OUT), 0)
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
        out["model.embed_tokens.weight"] = cat(st.get(_EMB), 0)
    for local, i in enumerate(stage_layers(cfg, pp, pp_rank)):
        if any(k.startswith(f"decoder.layers.{local}.") for k in parts[0]):
            out.update(family(cfg).layer_to_hf(st, cfg, local, i))
    if st.has(_FINAL_NORM):
        out["model.norm.weight"] = st.one(_FINAL_NORM)
    if st.has(_OUT):
        tensors = st.get(_OUT)
        if not cfg.tie_embeddings:
            out["lm_head.weight"] = cat(tensors, 0)
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
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (cfg.vocab_size, cfg.hidden_size)
    }
    fam = family(cfg)
    for i in range(cfg.num_layers):
        shapes.update(fam.layer_shapes(cfg, i))
    shapes["model.norm.weight"] = (cfg.hidden_size,)
    if not cfg.tie_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, cfg.hidden_size)
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
