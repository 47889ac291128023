"""The policy: a megatron-core GPT (one pipeline stage per process) for scoring and training.

Everything that trains or scores goes through :class:`Policy`: SFT, the RL log-prob pass (current
and reference model), the RL training pass, evaluation, checkpointing and weight sync.

Packed sequences (``megatron_rl.packing.batch.PackedBatch``): one row of ``T`` tokens, run in the
THD layout with Megatron's ``PackedSeqParams`` (``cu_seqlens``) and no mask, on GPU by Transformer
Engine's attention and on CPU by ``attention.VarlenDotProductAttention`` (per-sequence causal
attention: cost sum_i s_i², not T²). RoPE positions restart at 0 in every sequence (megatron-core's
THD RoPE); tested against running each sequence alone and against the dense block-diagonal mask.
Shared-prefix rows (``packing.pack_groups``: each GRPO group's prompt once, its responses as
segments attending to it) carry ``attention.PrefixSeqParams``: the varlen attention adds each
segment's prefix, RoPE rotates every token by its position in its sample; local spec only.

Context parallelism (``parallel.cp > 1``): each micro-batch is split per CP rank in Megatron/TE's
load-balanced THD layout (``megatron_rl/model/cp/te.py``: every sequence padded to a multiple of
``2 * cp``, rank r holding chunks r and 2cp-1-r); the attention is TE's on GPU and
``megatron_rl/model/cp/attention.py`` elsewhere, fed the same ``PackedSeqParams``. RoPE rotates each
token by its global position inside its sequence. Each rank scores its own next-token labels and
the log-probs / entropies are all-gathered over the CP group (with gradient), so ``loss_fn`` sees
whole rows and computes the same loss, with the same normaliser, on every CP rank. The schedule
multiplies the loss by ``cp`` and DDP averages grads over ``dp x cp``; together they add up the CP
ranks' shares of the gradient.

Log-prob alignment (see ``packing.py``): ``logprobs[t] = log softmax(logits[t-1] / T)[tokens[t]]``
(``T``: token t's ``extras["temp"]`` if the batch has it) within a sequence, 0 at sequence
starts; ``entropy[t]`` is the entropy of that same temperature-scaled distribution (the one that
predicts token t), also 0 at sequence starts. With TP the vocabulary is split; log-softmax and
entropy are computed with all-reduces over the TP group (never gathering the full ``[T, V]``).

Loss-normalisation contract of :meth:`Policy.forward_backward`: the gradient is that of
``sum over batches of loss_fn(batch, ...)``, exactly. The caller's ``loss_fn`` does all the
normalisation (e.g. divides by the token count of the whole step). Megatron's schedule divides each
micro-batch loss by the number of micro-batches; we multiply the loss handed to it by
``num_microbatches`` to undo that. Across data-parallel replicas,
Megatron DDP averages gradients, so with DP > 1 the step's gradient is the mean over DP ranks of
each rank's summed loss: a caller normalising by a global token count should multiply by ``dp``.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from megatron_rl.model import convert
from megatron_rl.model.config import ModelConfig, OptimizerConfig, ParallelConfig
from megatron_rl.model.cp import switch as cp_switch
from megatron_rl.model.cp.shard import (
    CPShard,
    all_gather_merge,
    check_same_batches,
    gather_token_aligned,
)
from megatron_rl.model.cp.te import te_cp_inputs
from megatron_rl.model.gpt import (
    TEMPERATURE_KEY,
    align_to_tokens,
    build_gpt_model,
    prediction_temperatures,
    use_te_spec,
    vocab_parallel_logprobs,
)
from megatron_rl.model.moe import ROUTES_KEY, RoutingReplay
from megatron_rl.model.parallel import DistInfo
from megatron_rl.model.policy_state import PolicyState
from megatron_rl.packing.batch import PackedBatch, pack, to_device

LossFn = Callable[[PackedBatch, Tensor, Tensor], tuple[Tensor, dict[str, Any]]]


class Policy(PolicyState):
    """The policy model chunk on this rank, with optional optimizer; see the module docstring.

    The optimizer step and the weight / optimizer state live in :class:`PolicyState`.
    """

    def __init__(
        self,
        model_cfg: ModelConfig,
        dist_info: DistInfo,
        train_cfg: OptimizerConfig | None = None,
        cp_min_tokens: int = 0,
    ) -> None:
        self.cfg = model_cfg
        self.dist = dist_info
        self.parallel = ParallelConfig(
            tp=dist_info.tp, pp=dist_info.pp, cp=dist_info.cp, ep=dist_info.ep, etp=dist_info.etp
        )
        # Batches go through the CP split / THD layout (with cp = 1 only when a benchmark swaps
        # in the CP attention to compare kernels; see benchmarks/long_context_cp.py).
        self.cp_layout = dist_info.cp > 1
        # micro-batches of sequences all shorter than this run whole, one per CP rank
        # (parallel.cp_min_tokens; megatron_rl/model/cp/switch.py); 0: every micro-batch is split
        self.cp_min_tokens = cp_min_tokens if self.cp_layout else 0
        self._solo = cp_switch.SoloGroups() if self.cp_min_tokens > 0 else None
        self.spec: convert.Spec = "te" if use_te_spec() else "local"
        self.module = build_gpt_model(
            model_cfg, dist_info.is_first_stage, dist_info.is_last_stage, self.parallel
        )
        self.model: Any = self.module  # the DDP wrapper when training, else the GPTModel
        first = dist_info.pp_rank * (model_cfg.num_layers // dist_info.pp)
        self.replay = RoutingReplay(self.module, model_cfg, first) if model_cfg.is_moe else None
        self.optimizer: Any = None
        if train_cfg is not None:
            self._build_training(train_cfg)
        self._configure_schedule()

    # ------------------------------------------------------------------ construction

    def _configure_schedule(self) -> None:
        from megatron.core.distributed import finalize_model_grads

        config = self.module.config
        config.variable_seq_lengths = self.dist.pp > 1  # packed rows differ in length
        if self.optimizer is not None:
            config.finalize_model_grads_func = finalize_model_grads
            config.no_sync_func = self.model.no_sync
            config.grad_scale_func = self.optimizer.scale_loss

    # ------------------------------------------------------------------ forward machinery

    def _forward(
        self, model: Any, tokens: Tensor, mask: Tensor | None, packed: Any, routes: Any = None
    ) -> Tensor:
        """``routes``: expert choices to replay (MoE), rows in router order; None routes freely."""
        if self.replay is not None:
            self.replay.set(routes)
        pos = torch.arange(tokens.shape[1], device=tokens.device)[None].expand_as(tokens)
        return model(tokens, pos, mask, packed_seq_params=packed)

    def _packed_inputs(self, batch: PackedBatch) -> tuple[Tensor, Tensor | None, Any]:
        """tokens [1, T], no mask, THD PackedSeqParams (TE on GPU, varlen attention on CPU)."""
        from megatron_rl.model.attention import row_params

        if batch.shared_prefix and self.spec == "te":
            raise ValueError(
                "shared-prefix rows need the local layer spec; under TE pack one sequence per "
                "sample (controller/batches.shared_prefix_enabled does)"
            )
        return batch.tokens[None], None, row_params(batch)

    def _run_schedule(
        self,
        batches: list[PackedBatch],
        on_logits: Callable[[PackedBatch, Tensor, CPShard | None], tuple[Tensor, dict[str, Any]]],
        forward_only: bool,
        switch: bool = True,
    ) -> list[dict[str, Any]]:
        """Run Megatron's forward(-backward) schedule over packed batches, one per micro-batch.

        ``on_logits(batch, logits [T, V/tp], part) -> (loss, outputs)`` runs on the last stage; the
        list of ``outputs`` comes back there (empty elsewhere). Under CP the logits are this
        rank's share [L, V/tp] and ``part`` (a ``CPShard``) says which tokens they are.
        """
        from megatron.core import parallel_state as mpu
        from megatron.core.pipeline_parallel import get_forward_backward_func

        batches = [to_device(b, self.dist.device) for b in batches]
        if self.cp_layout:
            check_same_batches(batches, mpu.get_context_parallel_group())
        min_tokens = self.cp_min_tokens if switch else 0  # switch=False: split every batch
        owner = cp_switch.owners(batches, min_tokens, self.dist.cp)
        order = [i for i, o in enumerate(owner) if o in (cp_switch.SPLIT, self.dist.cp_rank)]
        run = [batches[i] for i in order]
        if not run:  # every micro-batch is another CP rank's: join the step with an empty one
            order, run = [-1], [cp_switch.empty_like(batches[0])]
        whole = {id(batches[i]) for i, o in enumerate(owner) if o != cp_switch.SPLIT}
        if order == [-1]:
            whole.add(id(run[0]))
        n = len(run)
        # Undo the schedule's loss / num_microbatches. Its "* cp" stays: under CP every rank
        # computes the whole (gathered) loss, holds 1/cp-th of the graph, and DDP averages the
        # grads over dp x cp, so the factor cp turns that average into the needed CP sum.
        scale = float(n)

        def loss_func(
            batch: PackedBatch, part: CPShard | None, output: Tensor
        ) -> tuple[Tensor, dict[str, Any]]:
            loss, outputs = on_logits(batch, output[0], part)
            return loss * scale, outputs

        def forward_step(data_iterator: Any, model: Any) -> tuple[Tensor, Any]:
            batch = next(data_iterator)
            if id(batch) in whole:  # this rank runs it alone (megatron_rl/model/cp/switch.py)
                assert self._solo is not None
                tokens, mask, packed = self._packed_inputs(batch)
                with cp_switch.unsplit(model, self._solo):
                    out = self._forward(model, tokens, mask, packed)
                return out, partial(loss_func, batch, None)
            if self.cp_layout:
                cp_in = te_cp_inputs(batch, self.dist.cp, self.dist.cp_rank, self.dist.device)
                packed = cp_in.packed_seq_params
                out = model(cp_in.tokens, cp_in.position_ids, None, packed_seq_params=packed)
                return out, partial(loss_func, batch, cp_in.shard)
            tokens, mask, packed = self._packed_inputs(batch)
            out = self._forward(model, tokens, mask, packed, batch.extras.get(ROUTES_KEY))
            return out, partial(loss_func, batch, None)

        self.model.train(not forward_only)
        outs = get_forward_backward_func()(
            forward_step_func=forward_step,
            data_iterator=iter(run),
            model=[self.model],
            num_microbatches=n,
            seq_length=max(b.num_tokens for b in run),
            micro_batch_size=1,
            forward_only=forward_only,
        )
        if self._solo is None or not switch:
            return list(outs)
        return cp_switch.exchange_outputs(
            list(outs), order, owner, mpu.get_context_parallel_group()
        )

    def _token_stats(
        self,
        batch: PackedBatch,
        logits: Tensor,
        part: CPShard | None,
        temperature: float,
        with_entropy: bool,
    ) -> tuple[Tensor, Tensor | None]:
        """Log-probs [T] (and entropy [T]) of the whole row in token alignment, differentiable.

        Under CP (``part`` given) each rank scores its own labels and the results are gathered
        over the CP group, so every CP rank gets the whole row (and computes the whole loss).
        """
        if part is None:
            temps = prediction_temperatures(batch, temperature)
            lp, ent = vocab_parallel_logprobs(logits[:-1], batch.tokens[1:], temps, with_entropy)
            return align_to_tokens(lp, batch), None if ent is None else align_to_tokens(ent, batch)
        from megatron.core import parallel_state as mpu

        labels = part.labels.to(logits.device)
        t: float | Tensor = temperature
        if TEMPERATURE_KEY in part.extras:  # shifted like the labels; padding (0) scored at 1
            shard_t = part.extras[TEMPERATURE_KEY]
            t = torch.where(shard_t > 0, shard_t, torch.ones_like(shard_t))
        lp, ent = vocab_parallel_logprobs(logits, labels, t, with_entropy)
        group, rank = mpu.get_context_parallel_group(), self.dist.cp_rank
        lp = gather_token_aligned(lp, part, rank, group)
        return lp, None if ent is None else gather_token_aligned(ent, part, rank, group)

    def _broadcast_from_last_stage(self, tensor: Tensor) -> Tensor:
        """Copy ``tensor`` (valid on the last PP stage) to every stage of this pipeline."""
        if self.dist.pp == 1:
            return tensor
        from megatron.core import parallel_state as mpu

        dist.broadcast(
            tensor,
            src=mpu.get_pipeline_model_parallel_last_rank(),
            group=mpu.get_pipeline_model_parallel_group(),
        )
        return tensor

    def _broadcast_objects(self, objs: list[Any]) -> list[Any]:
        if self.dist.pp == 1:
            return objs
        from megatron.core import parallel_state as mpu

        box = [objs if self.dist.is_last_stage else None]
        dist.broadcast_object_list(
            box,
            src=mpu.get_pipeline_model_parallel_last_rank(),
            group=mpu.get_pipeline_model_parallel_group(),
        )
        return list(box[0] or [])

    # ------------------------------------------------------------------ scoring

    @torch.no_grad()
    def token_logprobs(
        self, batches: list[PackedBatch], temperature: float = 1.0, with_entropy: bool = False
    ) -> list[tuple[Tensor, Tensor | None]]:
        """Per batch: logprobs [T] (and entropy [T] or None), on CPU, on every rank.

        Tokens are scored at the batch's ``extras["temp"]`` (per token) if any, else at
        ``temperature``."""
        if not batches:
            return []

        def on_logits(
            batch: PackedBatch, logits: Tensor, part: CPShard | None
        ) -> tuple[Tensor, dict[str, Any]]:
            lp, ent = self._token_stats(batch, logits, part, temperature, with_entropy)
            out = {"lp": lp}
            if ent is not None:
                out["ent"] = ent
            return lp.new_zeros(()), out

        outs = self._run_schedule(batches, on_logits, forward_only=True)
        sizes = [b.num_tokens for b in batches]
        rows = 2 if with_entropy else 1
        flat = torch.zeros(rows, sum(sizes), device=self.dist.device)
        if self.dist.is_last_stage:
            flat[0] = torch.cat([o["lp"] for o in outs])
            if with_entropy:
                flat[1] = torch.cat([o["ent"] for o in outs])
        flat = self._broadcast_from_last_stage(flat).cpu()
        lps = torch.split(flat[0], sizes)
        ents = torch.split(flat[1], sizes) if with_entropy else [None] * len(sizes)
        return list(zip(lps, ents, strict=True))

    @torch.no_grad()
    def logits(self, tokens: Tensor, routes: Tensor | None = None) -> Tensor:
        """tokens [B, S] -> full-vocab logits [B, S, V] (causal per row), on every rank, on CPU.

        ``routes`` [B, S, L, k] (MoE): the experts to replay for every token and layer."""
        from megatron.core import parallel_state as mpu
        from megatron.core.pipeline_parallel import get_forward_backward_func
        from megatron.core.tensor_parallel.mappings import gather_from_tensor_model_parallel_region

        if self.cp_layout:
            return self._cp_logits(tokens)
        tokens = tokens.to(self.dist.device)
        b, s = tokens.shape
        causal = torch.ones(s, s, dtype=torch.bool, device=self.dist.device).triu(1)[None, None]
        mask = None if self.spec == "te" else causal  # TE's causal mask type needs none

        # the routers see the tokens sequence-major ([S, B] flattened)
        rows = None if routes is None else routes.transpose(0, 1).reshape(s * b, -1)

        def forward_step(data_iterator: Any, model: Any) -> tuple[Tensor, Any]:
            out = self._forward(model, next(data_iterator), mask, None, rows)
            return out, lambda o: (o.new_zeros(()), {"logits": o})

        self.model.eval()
        outs = get_forward_backward_func()(
            forward_step_func=forward_step,
            data_iterator=iter([tokens]),
            model=[self.model],
            num_microbatches=1,
            seq_length=s,
            micro_batch_size=b,
            forward_only=True,
        )
        full = torch.zeros(b, s, self.cfg.vocab_size, device=self.dist.device)
        if self.dist.is_last_stage:
            tp_group = mpu.get_tensor_model_parallel_group()
            full = gather_from_tensor_model_parallel_region(outs[0]["logits"], group=tp_group)
            full = full.float()
        return self._broadcast_from_last_stage(full.contiguous()).cpu()

    def _cp_logits(self, tokens: Tensor) -> Tensor:
        """:meth:`logits` under CP: the rows run as one packed batch split over the CP ranks."""
        from megatron.core import parallel_state as mpu
        from megatron.core.tensor_parallel.mappings import gather_from_tensor_model_parallel_region

        b, s = tokens.shape
        rows = pack(tokens.tolist(), [[0.0] * s] * b)

        def on_logits(
            batch: PackedBatch, logits: Tensor, part: CPShard | None
        ) -> tuple[Tensor, dict[str, Any]]:
            assert part is not None
            tp_group = mpu.get_tensor_model_parallel_group()
            full = gather_from_tensor_model_parallel_region(logits, group=tp_group).float()
            group = mpu.get_context_parallel_group()
            return full.new_zeros(()), {"rows": all_gather_merge(full, part.layout, group)}

        outs = self._run_schedule([rows], on_logits, forward_only=True, switch=False)
        full = torch.zeros(b * s, self.cfg.vocab_size, device=self.dist.device)
        if self.dist.is_last_stage:
            full = outs[0]["rows"]
        return self._broadcast_from_last_stage(full.reshape(b, s, -1).contiguous()).cpu()

    # ------------------------------------------------------------------ training

    def forward_backward(
        self, batches: list[PackedBatch], loss_fn: LossFn, temperature: float = 1.0
    ) -> list[dict[str, float]]:
        """Accumulate grads of sum_b loss_fn(b, logprobs [T], entropy [T]); metrics per batch.

        The caller normalises (see the module docstring); each metrics dict also holds "loss".
        Tokens are scored at the batch's ``extras["temp"]`` if any, else at ``temperature``.
        """
        if self.optimizer is None:
            raise ValueError("Policy.forward_backward needs a Policy built with train_cfg")
        if not batches:
            return []

        def on_logits(
            batch: PackedBatch, logits: Tensor, part: CPShard | None
        ) -> tuple[Tensor, dict[str, Any]]:
            lp, ent = self._token_stats(batch, logits, part, temperature, True)
            assert ent is not None
            loss, metrics = loss_fn(batch, lp, ent)
            floats = {k: float(v) for k, v in metrics.items()}
            floats["loss"] = float(loss.detach())
            return loss, floats

        outs = self._run_schedule(batches, on_logits, forward_only=False)
        return self._broadcast_objects(list(outs) if self.dist.is_last_stage else [])
