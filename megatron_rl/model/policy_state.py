"""The optimizer and state half of :class:`~megatron_rl.model.policy.Policy`.

:class:`PolicyState` is a base class of ``Policy``: it builds the training machinery (Megatron
DDP with fp32 grad buffers and Megatron's optimizer), takes optimizer steps, and moves this
rank's weights in and out: Megatron-named shards for checkpoints, optimizer state, and the
whole model in HF layout (streamed by ``export.gather_hf``) for weight sync and export. It
uses the attributes ``Policy.__init__`` sets: ``cfg``, ``dist``, ``spec``, ``module`` (this
rank's GPTModel chunk) and ``model`` (its DDP wrapper when training).
"""

from __future__ import annotations

import copy
import math
from typing import Any

from torch import Tensor

from megatron_rl.model import convert
from megatron_rl.model.config import ModelConfig, OptimizerConfig
from megatron_rl.model.parallel import DistInfo


class PolicyState:
    """Optimizer, step and weight/optimizer state of a Policy (see the module docstring)."""

    cfg: ModelConfig
    dist: DistInfo
    spec: convert.Spec
    module: Any
    model: Any
    optimizer: Any

    def _build_training(self, train_cfg: OptimizerConfig) -> None:
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
        from megatron.core.optimizer import OptimizerConfig as MegatronOptimizerConfig
        from megatron.core.optimizer import get_megatron_optimizer

        tcfg = self.module.config
        ddp_cfg = DistributedDataParallelConfig(
            grad_reduce_in_fp32=True, overlap_grad_reduce=False, use_distributed_optimizer=False
        )
        self.model = DistributedDataParallel(config=tcfg, ddp_config=ddp_cfg, module=self.module)
        opt_cfg = MegatronOptimizerConfig(
            optimizer="adam",
            lr=train_cfg.lr,
            weight_decay=train_cfg.weight_decay,
            adam_beta1=train_cfg.adam_beta1,
            adam_beta2=train_cfg.adam_beta2,
            adam_eps=train_cfg.adam_eps,
            clip_grad=train_cfg.grad_clip,
            bf16=tcfg.bf16,
            fp16=tcfg.fp16,
            params_dtype=tcfg.params_dtype,
        )
        self.optimizer = get_megatron_optimizer(opt_cfg, [self.model])
        self.weight_decay = train_cfg.weight_decay
        self.grad_clip = train_cfg.grad_clip

    def optimizer_step(self, lr: float) -> dict[str, float]:
        """Clip and apply the accumulated grads at learning rate ``lr``; zero the grads.

        A non-finite grad norm (or an fp16 overflow) skips the update (``skipped=1``). Returns
        grad_norm, lr, skipped. Grads are prepared (with fp16: unscaled, loss scale updated) once:
        Megatron's ``optimizer.step()`` would prepare them again, so its parts are called here.
        Weight decay times each param group's ``wd_mult`` (0 for biases and norms), which
        Megatron applies only through its LR scheduler (not used here).
        """
        if self.optimizer is None:
            raise ValueError("Policy.optimizer_step needs a Policy built with train_cfg")
        for group in self.optimizer.param_groups:
            group["lr"] = lr
            group["weight_decay"] = self.weight_decay * group.get("wd_mult", 1.0)
        found_inf = self.optimizer.prepare_grads()
        grad_norm = float("nan") if found_inf else float(self.optimizer.get_grad_norm())
        skipped = not math.isfinite(grad_norm)
        if not skipped:
            self._clip_grads(grad_norm)
            skipped = not self.optimizer.step_with_ready_grads()
        self.zero_grad()
        return {"grad_norm": grad_norm, "lr": lr, "skipped": float(skipped)}

    def _clip_grads(self, grad_norm: float) -> None:
        """Scale the prepared main grads so their global norm is at most ``grad_clip``."""
        from megatron.core.optimizer.clip_grads import clip_grad_by_total_norm_fp32

        if self.grad_clip <= 0:
            return
        for opt in getattr(self.optimizer, "chained_optimizers", [self.optimizer]):
            params = opt.get_parameters()
            if params:
                clip_grad_by_total_norm_fp32(params, self.grad_clip, grad_norm)

    def zero_grad(self) -> None:
        """Drop accumulated gradients (DDP grad buffers and optimizer grads)."""
        if self.optimizer is not None:
            self.model.zero_grad_buffer()
            self.optimizer.zero_grad()

    # ------------------------------------------------------------------ state

    def model_state_shard(self) -> dict[str, Tensor]:
        """This rank's parameters with Megatron names (layers numbered within the stage)."""
        sd = self.module.state_dict()
        return {k: v.detach().clone() for k, v in sd.items() if not k.endswith("_extra_state")}

    def load_model_state_shard(self, sd: dict[str, Tensor]) -> None:
        """Load this rank's Megatron-named parameters (every parameter must be present)."""
        result = self.module.load_state_dict(sd, strict=False)
        missing = [k for k in result.missing_keys if not k.endswith("_extra_state")]
        if missing or result.unexpected_keys:
            raise ValueError(
                f"model state shard does not fit this rank (tp_rank={self.dist.tp_rank}, "
                f"pp_rank={self.dist.pp_rank}): missing {missing[:3]}, "
                f"unexpected {result.unexpected_keys[:3]}"
            )
        if self.optimizer is not None:
            self.optimizer.reload_model_params()

    def optimizer_state(self) -> Any:
        """A copy of this rank's optimizer state (safe to keep while training continues)."""
        if self.optimizer is None:
            raise ValueError("Policy.optimizer_state needs a Policy built with train_cfg")
        return copy.deepcopy(self.optimizer.state_dict())

    def load_optimizer_state(self, sd: Any) -> None:
        """Restore optimizer state; each parameter gets its own Adam ``step`` tensor back."""
        if self.optimizer is None:
            raise ValueError("Policy.load_optimizer_state needs a Policy built with train_cfg")
        self.optimizer.load_state_dict(copy.deepcopy(sd))
        for opt in getattr(self.optimizer, "chained_optimizers", [self.optimizer]):
            for state in opt.optimizer.state.values():
                if isinstance(state.get("step"), Tensor):
                    state["step"] = state["step"].clone()

    def hf_state_dict(self) -> dict[str, Tensor]:
        """The full model in HF Llama/Qwen2 layout on global rank 0 (CPU tensors); ``{}`` elsewhere.

        Collective: every rank calls it. Streams stage by stage, bucket by bucket, gathering only
        over TP inside each PP stage (``megatron_rl.model.export``), never over the world.
        """
        from megatron_rl.model.export import gather_hf

        return gather_hf(self)

    def load_hf_state_dict(self, hf_sd: dict[str, Tensor]) -> None:
        """Load this rank's share of a full HF-layout state dict (every rank passes the same)."""
        convert.check_hf_state_dict(hf_sd, self.cfg, "Policy.load_hf_state_dict")
        shard = convert.hf_to_megatron_rank(hf_sd, self.cfg, **self.dist.shard(), spec=self.spec)
        device = self.dist.device
        self.load_model_state_shard({k: v.to(device) for k, v in shard.items()})
