"""The mixture-of-experts MLP shared by the MoE families: router, routed experts, shared experts.

HF layout of one MoE layer (``model.layers.{i}.mlp.``; transformers 5 fuses the experts into
3-D tensors in memory but saves and loads this per-expert layout):

* ``gate.weight`` ``[E, hidden]``: the router.
* ``experts.{e}.gate_proj / up_proj / down_proj.weight``: expert ``e``'s SwiGLU.
* Qwen2-MoE only: ``shared_expert.{gate,up,down}_proj.weight`` and ``shared_expert_gate.weight``
  ``[1, hidden]`` (a sigmoid gate on the shared expert's output).

Megatron layout (megatron-core's ``MoELayer``):

* ``mlp.router.weight`` ``[E, hidden]``, replicated over TP and EP.
* Routed experts, split over EP: EP rank r holds experts ``r * E/ep .. (r+1) * E/ep - 1`` as
  local experts ``0 .. E/ep - 1``. Each is split over the expert-TP ranks like a dense SwiGLU
  (``linear_fc1`` = [gate slice; up slice] of that rank, ``linear_fc2`` row parallel). Names:
  ``mlp.experts.local_experts.{j}.linear_fc{1,2}.weight`` with the local spec (``SequentialMLP``,
  CPU), ``mlp.experts.linear_fc{1,2}.weight{j}`` with the TE spec (``TEGroupedMLP``: grouped
  GEMM on GPU). ``spec=`` picks the naming on the way in; the way out reads either.
* Shared experts: ``mlp.shared_experts.linear_fc{1,2}.weight`` split over TP like a dense MLP,
  ``mlp.shared_experts.gate_weight`` ``[1, hidden]`` replicated.
* The MLP input norm is ``pre_mlp_layernorm.weight`` with both specs (TE fuses it into a dense
  ``linear_fc1`` only; the router needs the normed input).
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from megatron_rl.model.arch.base import (
    NORM_NAMES,
    DenseFamily,
    RankShard,
    ShardReader,
    Spec,
    swiglu_to_hf,
    swiglu_to_megatron,
)
from megatron_rl.model.config import ModelConfig


def _expert_names(spec: str, j: int) -> tuple[str, str]:
    if spec == "te":
        return f"mlp.experts.linear_fc1.weight{j}", f"mlp.experts.linear_fc2.weight{j}"
    e = f"mlp.experts.local_experts.{j}."
    return e + "linear_fc1.weight", e + "linear_fc2.weight"


class MoEMixin(DenseFamily):
    """Replaces the dense MLP of a family with megatron-core's MoE layer (mix in first)."""

    hf_shared_expert = ""  # HF prefix of the shared expert under ``mlp.`` ('' : none)

    def spec_options(self, cfg: ModelConfig) -> dict[str, Any]:
        return {**super().spec_options(cfg), "num_experts": cfg.moe.num_experts}

    def norm_names(self, spec: str) -> tuple[str, str]:
        return NORM_NAMES[spec][0], NORM_NAMES["local"][1]

    # ------------------------------------------------------------------ HF tensors

    def mlp_shapes(self, cfg: ModelConfig, i: int) -> dict[str, tuple[int, ...]]:
        m, hd, moe = f"model.layers.{i}.mlp.", cfg.hidden_size, cfg.moe
        shapes: dict[str, tuple[int, ...]] = {m + "gate.weight": (moe.num_experts, hd)}
        for e in range(moe.num_experts):
            x, f = f"{m}experts.{e}.", moe.ffn_hidden_size
            shapes.update(
                {
                    x + "gate_proj.weight": (f, hd),
                    x + "up_proj.weight": (f, hd),
                    x + "down_proj.weight": (hd, f),
                }
            )
        if moe.shared_ffn_hidden_size:
            x, f = f"{m}{self.hf_shared_expert}.", moe.shared_ffn_hidden_size
            shapes.update(
                {
                    x + "gate_proj.weight": (f, hd),
                    x + "up_proj.weight": (f, hd),
                    x + "down_proj.weight": (hd, f),
                }
            )
            if moe.shared_expert_gate:
                shapes[f"{m}{self.hf_shared_expert}_gate.weight"] = (1, hd)
        return shapes

    # ------------------------------------------------------------------ HF -> Megatron

    def mlp_to_megatron(
        self, hf_sd: dict[str, Tensor], cfg: ModelConfig, m: str, rank: RankShard, spec: Spec
    ) -> dict[str, Tensor]:
        moe = cfg.moe
        out = {"mlp.router.weight": hf_sd[m + "gate.weight"]}
        per_rank = moe.num_experts // rank.ep
        for j in range(per_rank):
            e = rank.ep_rank * per_rank + j
            part = swiglu_to_megatron(hf_sd, f"{m}experts.{e}.", "", rank.etp, rank.etp_rank)
            fc1, fc2 = _expert_names(spec, j)
            out[fc1], out[fc2] = part["linear_fc1.weight"], part["linear_fc2.weight"]
        if moe.shared_ffn_hidden_size:
            x = f"{m}{self.hf_shared_expert}."
            out.update(swiglu_to_megatron(hf_sd, x, "mlp.shared_experts.", rank.tp, rank.tp_rank))
            if moe.shared_expert_gate:
                gate = hf_sd[f"{m}{self.hf_shared_expert}_gate.weight"]
                out["mlp.shared_experts.gate_weight"] = gate
        return out

    # ------------------------------------------------------------------ Megatron -> HF

    def mlp_to_hf(self, st: ShardReader, cfg: ModelConfig, m: str, h: str) -> dict[str, Tensor]:
        moe = cfg.moe
        out = {h + "gate.weight": st.one(m + "mlp.router.weight")}
        spec = "te" if st.has(m + _expert_names("te", 0)[0]) else "local"
        per_rank = moe.num_experts // len(st.experts(m + _expert_names(spec, 0)[0]))
        for j in range(per_rank):
            fc1, fc2 = (st.experts(m + n) for n in _expert_names(spec, j))
            for r, (fc1_parts, fc2_parts) in enumerate(zip(fc1, fc2, strict=True)):
                out.update(swiglu_to_hf(fc1_parts, fc2_parts, f"{h}experts.{r * per_rank + j}."))
        if moe.shared_ffn_hidden_size:
            s = m + "mlp.shared_experts."
            x = f"{h}{self.hf_shared_expert}."
            out.update(
                swiglu_to_hf(st.get(s + "linear_fc1.weight"), st.get(s + "linear_fc2.weight"), x)
            )
            if moe.shared_expert_gate:
                out[f"{h}{self.hf_shared_expert}_gate.weight"] = st.one(s + "gate_weight")
        return out


def refuse_dense_layers(config: dict[str, Any], hf_class: str) -> None:
    """Every layer must be an MoE layer (all released Qwen MoE checkpoints are)."""
    if int(config.get("decoder_sparse_step", 1)) != 1 or config.get("mlp_only_layers"):
        raise ValueError(
            f"{hf_class} with dense layers (decoder_sparse_step != 1 or "
            "mlp_only_layers) is not supported; every layer must be MoE"
        )
