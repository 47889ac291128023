"""HF <-> Megatron weight conversion, as pure state-dict functions, for every model family.

One converter serves both the ``megatron-rl convert`` command and weight sync to the rollout
engines, so it works on state dicts only (no ``torch.distributed``) and moves tensors with views,
``chunk`` and ``cat`` (never per-element Python work). This module runs the parts every family
shares; one transformer layer's tensors are its family's (``megatron_rl/model/arch/``, where
the per-layer Megatron names and layouts are described).

Megatron ``GPTModel.state_dict()`` layout produced for one (tp_rank, pp_rank) (and, for a MoE
model split over expert-parallel ranks, ep_rank: each rank's file holds its own experts):

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
from megatron_rl.model.arch.base import SPECS, RankShard, Spec, cat, tp_chunk
from megatron_rl.model.config import ModelConfig

_EMB = "embedding.word_embeddings.weight"
_OUT = "output_layer.weight"
_FINAL_NORM = "decoder.final_layernorm.weight"


def check_layout(cfg: ModelConfig, tp: int, pp: int, ep: int = 1, etp: int = 0) -> None:
    """Raise a one-line ``ValueError`` when ``tp``/``pp``/``ep``/``etp`` cannot split ``cfg``.

    ``etp`` is the tensor-parallel degree inside one expert: 1 or ``tp`` (0 means ``tp``).
    """
    if tp < 1 or pp < 1 or ep < 1:
        raise ValueError(f"tp, pp and ep must be >= 1, got tp={tp} pp={pp} ep={ep}")
    if etp not in (0, 1, tp):
        raise ValueError(f"etp={etp} must be 1 or tp={tp} (0: tp)")
    divisible = {
        "num_attention_heads": cfg.num_attention_heads,
        "num_query_groups": cfg.num_query_groups,
        "vocab_size": cfg.vocab_size,
    }
    if cfg.is_moe:
        if cfg.moe.shared_ffn_hidden_size:
            divisible["moe.shared_ffn_hidden_size"] = cfg.moe.shared_ffn_hidden_size
    else:
        divisible["ffn_hidden_size"] = cfg.ffn_hidden_size
    for name, value in divisible.items():
        if value % tp:
            raise ValueError(f"tp={tp} must divide {name}={value}; choose tp among its divisors")
    if cfg.num_layers % pp:
        raise ValueError(
            f"pp={pp} must divide num_layers={cfg.num_layers}; choose pp among its divisors"
        )
    _check_experts(cfg, ep, etp or tp)


def _check_experts(cfg: ModelConfig, ep: int, etp: int) -> None:
    if not cfg.is_moe:
        if ep > 1:
            raise ValueError(
                f"ep={ep} needs a mixture-of-experts model; model.arch={cfg.arch} "
                "is dense, use ep=1"
            )
        return
    if cfg.moe.num_experts % ep:
        raise ValueError(
            f"ep={ep} must divide moe.num_experts={cfg.moe.num_experts}; choose ep "
            "among its divisors"
        )
    if cfg.moe.ffn_hidden_size % etp:
        raise ValueError(
            f"the expert tensor-parallel degree {etp} must divide "
            f"moe.ffn_hidden_size={cfg.moe.ffn_hidden_size}"
        )


def stage_layers(cfg: ModelConfig, pp: int, pp_rank: int) -> range:
    """Global layer indices held by pipeline stage ``pp_rank`` of ``pp``."""
    per = cfg.num_layers // pp
    return range(pp_rank * per, (pp_rank + 1) * per)


def shard_key(tp_rank: int, pp_rank: int, ep_rank: int, ep: int) -> tuple[int, ...]:
    """Key of one rank's shard: ``(tp_rank, pp_rank)``, or ``(tp_rank, pp_rank, ep_rank)``
    when experts are split (``ep > 1``)."""
    return (tp_rank, pp_rank) if ep == 1 else (tp_rank, pp_rank, ep_rank)


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
    ep: int = 1,
    ep_rank: int = 0,
    etp: int = 0,
) -> dict[str, Tensor]:
    """The ``GPTModel.state_dict()`` of the rank at (``tp_rank``, ``pp_rank``, ``ep_rank``).

    ``hf_sd`` uses HF names (``model.layers.{i}.self_attn.q_proj.weight``, ...).
    Returned tensors may be views of ``hf_sd`` (no copy where the layout allows); call
    ``.contiguous()`` before writing them if needed (the safetensors I/O here does).
    """
    check_layout(cfg, tp, pp, ep, etp)
    if spec not in SPECS:
        raise ValueError(f"unknown Megatron layer spec {spec!r}; choose one of {list(SPECS)}")
    rank = RankShard(tp, tp_rank, ep, ep_rank, etp or tp)
    out: dict[str, Tensor] = {}
    first, last = pp_rank == 0, pp_rank == pp - 1
    if first:
        out[_EMB] = tp_chunk(hf_sd["model.embed_tokens.weight"], tp, tp_rank, 0)
    fam = family(cfg)
    for local, i in enumerate(stage_layers(cfg, pp, pp_rank)):
        for name, t in fam.layer_to_megatron(hf_sd, cfg, i, rank, spec).items():
            out[f"decoder.layers.{local}.{name}"] = t
    if last:
        out[_FINAL_NORM] = hf_sd["model.norm.weight"]
        if not cfg.tie_embeddings:
            out[_OUT] = tp_chunk(hf_sd["lm_head.weight"], tp, tp_rank, 0)
        elif pp > 1:
            out[_OUT] = tp_chunk(hf_sd["model.embed_tokens.weight"], tp, tp_rank, 0)
    return out


def hf_to_megatron(
    hf_sd: dict[str, Tensor],
    cfg: ModelConfig,
    tp: int = 1,
    pp: int = 1,
    spec: Spec = "local",
    ep: int = 1,
    etp: int = 0,
) -> dict[tuple[int, ...], dict[str, Tensor]]:
    """All shards, keyed by :func:`shard_key`."""
    return {
        shard_key(t, p, e, ep): hf_to_megatron_rank(hf_sd, cfg, tp, t, pp, p, spec, ep, e, etp)
        for p in range(pp)
        for e in range(ep)
        for t in range(tp)
    }


# ----------------------------------------------------------------------------------------------
# Megatron -> HF


def megatron_shard_shapes(
    cfg: ModelConfig, tp: int, pp: int, pp_rank: int, ep: int = 1, etp: int = 0
) -> dict[str, tuple]:
    """Name -> shape of every tensor of one rank of stage ``pp_rank`` (both spec namings).

    Computed by converting ``meta``-device tensors, so it costs no memory and cannot disagree
    with :func:`hf_to_megatron_rank`.
    """
    meta = {n: torch.empty(s, device="meta") for n, s in hf_param_shapes(cfg).items()}
    shapes: dict[str, tuple] = {}
    for spec in SPECS:
        shard = hf_to_megatron_rank(meta, cfg, tp, 0, pp, pp_rank, spec, ep, 0, etp)  # type: ignore[arg-type]
        shapes.update({n: tuple(t.shape) for n, t in shard.items()})
    return shapes


class _Shards:
    """Reads named tensors from one PP stage's shards and records what was consumed.

    ``by_rank[(tp_rank, ep_rank)]`` is a rank's state dict (all of it, or a part: whole units).
    Dense tensors are read from EP rank 0, experts from every EP rank.
    """

    def __init__(
        self,
        by_rank: dict[tuple[int, int], dict[str, Tensor]],
        cfg: ModelConfig,
        grid: tuple[int, int, int, int],
        pp_rank: int,
    ):
        tp, pp, ep, etp = grid
        missing = [(t, e) for e in range(ep) for t in range(tp) if (t, e) not in by_rank]
        if missing:
            raise ValueError(
                f"missing Megatron shard(s) of pipeline stage {pp_rank} "
                f"(tp_rank, ep_rank): {missing}"
            )
        self.by_rank, self.tp, self.ep, self.etp = by_rank, tp, ep, etp or tp
        self.pp_rank = pp_rank
        self.used: set[str] = set()
        self.shapes = megatron_shard_shapes(cfg, tp, pp, pp_rank, ep, etp)

    def has(self, name: str) -> bool:
        return name in self.by_rank[(0, 0)]

    def _read(self, name: str, t: int, e: int) -> Tensor:
        t_ = self.by_rank[(t, e)].get(name)
        where = f"Megatron shard (tp_rank={t}, pp_rank={self.pp_rank}, ep_rank={e})"
        if t_ is None:
            raise ValueError(f"{where} has no tensor {name!r}")
        if tuple(t_.shape) != self.shapes[name]:
            raise ValueError(
                f"{where}: tensor {name!r} has shape {tuple(t_.shape)}, the config "
                f"implies {self.shapes[name]}"
            )
        self.used.add(name)
        return t_

    def get(self, name: str) -> list[Tensor]:
        """The tensor ``name`` from every TP rank of this stage (rank order)."""
        return [self._read(name, t, 0) for t in range(self.tp)]

    def one(self, name: str) -> Tensor:
        """A replicated tensor (taken from TP rank 0)."""
        return self._read(name, 0, 0)

    def experts(self, name: str) -> list[list[Tensor]]:
        """An expert tensor from every EP rank, each as its expert-TP parts."""
        return [[self._read(name, t, e) for t in range(self.etp)] for e in range(self.ep)]

    def unused(self) -> list[str]:
        names: Iterable[str] = (n for r in self.by_rank.values() for n in r)
        return sorted({n for n in names if n not in self.used and not n.endswith("_extra_state")})


def megatron_to_hf(
    shards: dict[tuple[int, ...], dict[str, Tensor]],
    cfg: ModelConfig,
    tp: int = 1,
    pp: int = 1,
    ep: int = 1,
    etp: int = 0,
) -> dict[str, Tensor]:
    """Merge Megatron shards (keyed by :func:`shard_key`) into one HF state dict.

    Returned tensors may be views of the shards (at TP=1 most are). Either layer-spec naming is
    accepted. A tensor the HF model has no place for raises a
    ``ValueError`` naming it (``_extra_state`` entries are skipped). With tied embeddings no
    ``lm_head.weight`` is returned (HF re-ties it on load; weight sync adds it where needed).
    """
    check_layout(cfg, tp, pp, ep, etp)
    out: dict[str, Tensor] = {}
    for p in range(pp):
        by_rank = {
            (t, e): shards[k]
            for e in range(ep)
            for t in range(tp)
            if (k := shard_key(t, p, e, ep)) in shards
        }
        st = _Shards(by_rank, cfg, (tp, pp, ep, etp), p)
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
        _check_used(st, p)
    return out


def _check_used(st: _Shards, pp_rank: int) -> None:
    extra = st.unused()
    if extra:
        raise ValueError(
            f"Megatron shard of pipeline stage {pp_rank} has tensor(s) with no HF counterpart "
            f"for this config: {extra[:5]}"
        )


def stage_part_to_hf(
    parts: dict[tuple[int, int], dict[str, Tensor]],
    cfg: ModelConfig,
    grid: tuple[int, int, int, int],
    pp_rank: int,
) -> dict[str, Tensor]:
    """HF tensors of a *part* of one PP stage: whole units (embedding, layers, final norm/output).

    ``parts[(tp_rank, ep_rank)]`` holds that rank's tensors of those units (EP ranks > 0: their
    experts only); ``grid`` is ``(tp, pp, ep, etp)``. Used to stream a model out bucket by bucket
    (``megatron_rl.model.export``) instead of merging every stage at once as
    :func:`megatron_to_hf` does.
    """
    st = _Shards(parts, cfg, grid, pp_rank)
    out: dict[str, Tensor] = {}
    if st.has(_EMB):
        out["model.embed_tokens.weight"] = cat(st.get(_EMB), 0)
    for local, i in enumerate(stage_layers(cfg, grid[1], pp_rank)):
        if any(k.startswith(f"decoder.layers.{local}.") for k in parts[(0, 0)]):
            out.update(family(cfg).layer_to_hf(st, cfg, local, i))
    if st.has(_FINAL_NORM):
        out["model.norm.weight"] = st.one(_FINAL_NORM)
    if st.has(_OUT):
        tensors = st.get(_OUT)
        if not cfg.tie_embeddings:
            out["lm_head.weight"] = cat(tensors, 0)
    _check_used(st, pp_rank)
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
