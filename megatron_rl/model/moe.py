"""megatron-core's MoE layer in the policy: TransformerConfig settings, the layer, routing replay.

Settings (:func:`transformer_kwargs`), from ``model.moe`` and ``parallel``:

* top-k softmax routing; ``norm_topk_prob`` is Megatron's ``moe_router_pre_softmax=False`` (the
  softmax over the top-k logits, which equals HF's renormalised top-k probabilities), ``False``
  is ``pre_softmax=True``; no token dropping (dropless, as HF), router in the model dtype (as HF).
* aux loss: Megatron's switch load-balancing loss (``aux_loss`` type) with ``aux_loss_coeff``;
  z-loss with ``z_loss_coeff`` (passed times ``tp``: megatron divides it by the TP size, which
  is right only with sequence parallelism); both off at 0. Megatron attaches them to the
  router's output, so they add to the gradient without appearing in the RL loss; their values
  are read from Megatron's aux-loss tracker (:func:`pop_aux_losses`).
* dispatcher: ``alltoall`` (default; CPU over gloo and GPU over NCCL: ``all_to_all_single`` with
  uneven splits, which gloo has) or ``allgather`` (one PP stage only: megatron-core refuses it with
  variable sequence lengths). Experts: ``SequentialMLP`` with the local spec (CPU), TE's grouped
  GEMM (``TEGroupedMLP``, ``moe_grouped_gemm``) with the TE spec (GPU).
* ``expert_model_parallel_size = parallel.ep``, ``expert_tensor_parallel_size = parallel.etp``.

Deviation: megatron-core refuses to *train* an MoE layer with TP > 1 unless sequence parallelism
is on. Sequence parallelism does not run on the CPU path (the torch norms refuse it) and is off
on GPU too, so :func:`allow_tp_without_sp` lifts that check and corrects what it guards: every
TP rank routes the same (replicated) tokens, the dispatcher sends each expert its tokens from
every TP rank, and the combine's reduce-scatter hands each rank back the full output, so the
forward is exact, but each routed expert's weights receive the gradient of every TP rank's
copy of its tokens: ``tp`` times the true gradient (measured: the grad norm of EP=2 x TP=2 came
out 21.10 against 17.50 at EP=1 before the fix). A hook on every routed expert parameter scales
its gradient by ``1 / tp``; with it EP x TP equals EP=1
(``tests/integration/dist/moe_equivalence.py``).
The cost is expert work repeated ``tp`` times.

Routing replay (``rl.routing_replay: rollout``, arXiv 2510.11370 "Rollout Routing Replay"):
the engine returns the experts it chose for every token and layer; :class:`RoutingReplay` hands
them to megatron-core's own ``RouterReplay`` (``moe_enable_routing_replay``) before each
micro-batch's forward, so the router's top-k is replaced by the recorded indices while the
weights of those experts are still the trainer's softmax (gradients reach the router). Routes
travel with a packed batch as ``extras["routes"]``: ``[T, L * k]`` expert ids (as floats), row
t being token t's choices in every layer (see :func:`routes_extra`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from megatron_rl.model.config import ModelConfig, ParallelConfig

ROUTES_KEY = "routes"  # PackedBatch.extras key of the replayed routing, [T, L * k]


def transformer_kwargs(cfg: ModelConfig, parallel: ParallelConfig) -> dict[str, Any]:
    """The MoE keywords of megatron's ``TransformerConfig`` (empty for a dense model)."""
    if not cfg.is_moe:
        return {}
    moe = cfg.moe
    te = use_grouped_gemm()
    return dict(
        num_moe_experts=moe.num_experts,
        moe_ffn_hidden_size=moe.ffn_hidden_size,
        moe_router_topk=moe.topk,
        moe_router_score_function="softmax",
        moe_router_pre_softmax=not moe.norm_topk_prob,
        moe_router_load_balancing_type="aux_loss" if moe.aux_loss_coeff > 0 else "none",
        moe_aux_loss_coeff=moe.aux_loss_coeff,
        # megatron divides the z-loss weight by the TP size, for sequence parallelism, where each
        # TP rank holds 1/tp of the tokens and the router's grads are summed over TP; here every
        # TP rank holds all of them and the router's grads are not summed: undo the division
        moe_z_loss_coeff=moe.z_loss_coeff * parallel.tp or None,
        moe_shared_expert_intermediate_size=moe.shared_ffn_hidden_size or None,
        moe_shared_expert_gate=moe.shared_expert_gate,
        moe_token_dispatcher_type=moe.dispatcher,
        moe_grouped_gemm=te,
        moe_permute_fusion=False,
        moe_router_fusion=False,
        moe_enable_routing_replay=True,  # idle (no action set) unless a batch carries routes
        expert_model_parallel_size=parallel.ep,
        expert_tensor_parallel_size=parallel.expert_tp,
    )


def use_grouped_gemm() -> bool:
    """TE's grouped GEMM for the experts: with the TE layer spec (CUDA + Transformer Engine)."""
    from megatron_rl.model.parallel import use_te_spec

    return use_te_spec()


class _OneRank:
    """Stands in for the attention TP group in the one check :func:`allow_tp_without_sp` lifts."""

    def size(self) -> int:
        return 1


def allow_tp_without_sp(model: Any, tp: int) -> None:
    """Lift megatron-core's TP-without-SP training check on every MoE layer of ``model`` and scale
    the routed experts' gradients by ``1 / tp`` (see the module docstring).

    ``MoELayer.attn_tp_group`` is read by that check alone (megatron-core 0.16.1 and 0.19).
    """
    from megatron.core.transformer.moe.moe_layer import MoELayer

    for m in model.modules():
        if not isinstance(m, MoELayer):
            continue
        assert hasattr(m, "attn_tp_group"), "megatron-core changed MoELayer.attn_tp_group"
        m.attn_tp_group = _OneRank()
        if tp > 1:
            for p in m.experts.parameters():
                p.register_hook(lambda g, s=1.0 / tp: g * s)


# ----------------------------------------------------------------------------------------------
# routing replay


def routes_extra(routes: Tensor) -> Tensor:
    """Per-token routes ``[T, L, k]`` (ints) -> the ``extras["routes"]`` row layout ``[T, L*k]``."""
    return routes.reshape(routes.shape[0], -1).float()


class RoutingReplay:
    """The routers of one pipeline stage, and the routes they replay for the next forward."""

    def __init__(self, module: Any, cfg: ModelConfig, first_layer: int) -> None:
        from megatron.core.transformer.moe.router import TopKRouter

        self.routers = [m for m in module.modules() if isinstance(m, TopKRouter)]
        self.first_layer, self.cfg = first_layer, cfg
        self.recording = False
        assert all(r.router_replay is not None for r in self.routers)

    def set(self, routes: Tensor | None) -> None:
        """Replay ``routes`` in the next forward: ``[N, L * k]`` rows in the order the routers see
        the tokens (packed THD: the row's tokens), or None: route freely (and record the choices
        if :meth:`record` is on)."""
        from megatron.core.transformer.moe.router_replay import RouterReplayAction

        for layer, router in enumerate(self.routers):
            replay = router.router_replay
            replay.clear_indices()
            if routes is None:
                if self.recording:
                    replay.set_router_replay_action(RouterReplayAction.RECORD)
                else:
                    replay.clear_router_replay_action()
                continue
            k = self.cfg.moe.topk
            idx = routes.view(routes.shape[0], -1, k)[:, self.first_layer + layer]
            replay.set_target_indices(idx.to(torch.long).contiguous())
            replay.set_router_replay_action(RouterReplayAction.REPLAY_FORWARD)

    def record(self, on: bool = True) -> None:
        """While on, forwards that route freely keep their choices (read by :meth:`recorded`)."""
        self.recording = on

    def recorded(self) -> Tensor:
        """The choices of the last free forward on this stage, ``[N, L_stage, k]``."""
        return torch.stack([r.router_replay.get_recorded_indices() for r in self.routers], dim=1)


def pop_aux_losses(micro_batches: int) -> dict[str, float]:
    """Each MoE aux loss megatron-core tracked since the last call (``moe/load_balancing_loss``,
    ``moe/z_loss``; unscaled by their weights), averaged over the micro-batches and over this
    rank's MoE layers, then clear the tracker. Empty when none is on."""
    from megatron.core.transformer.moe.moe_utils import (
        clear_aux_losses_tracker,
        get_moe_layer_wise_logging_tracker,
    )

    out = {}
    for name, entry in get_moe_layer_wise_logging_tracker().items():
        values = entry.get("values")
        mine = values[values != 0] if values is not None else None  # other stages' layers: 0
        if mine is not None and mine.numel():
            out[f"moe/{name}"] = float(mine.float().mean()) / max(micro_batches, 1)
    clear_aux_losses_tracker()
    return out
