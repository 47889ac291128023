"""Optimizer, SFT, RL-loss and checkpoint settings: the ``train``, ``sft``, ``rl`` and
``checkpoint`` sections, read by the loop (``train/``), the controller and the losses
(``megatron_rl/losses.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from megatron_rl.model.config import OptimizerConfig

# How the token terms of a step add up to its loss (rl.loss_agg; megatron_rl/losses.py has the
# formulas).
LossAgg = Literal[
    "token_mean", "seq_mean_token_sum", "seq_mean_token_mean", "seq_mean_token_sum_norm"
]
KLEstimator = Literal["k1", "k2", "k3"]  # Schulman's KL estimators (rl.kl_estimator)


@dataclass
class TrainConfig(OptimizerConfig):
    """Optimizer (the model's :class:`OptimizerConfig` fields) and step counts of SFT and RL."""

    min_lr: float = 0.0  # floor of the cosine decay
    warmup_steps: int = 0  # linear warm-up, optimizer steps
    lr_schedule: Literal["constant", "cosine"] = "constant"  # decay after warm-up
    steps: int = 100  # optimizer steps in the run
    rollout_budget_groups: int = 0  # RL: end the run (final sweep, checkpoint) after the step
    # that brings the groups generated to this many (0: no budget; the LR schedule still runs
    # over train.steps): equal generation across arms that generate unequal groups per step
    micro_batch_tokens: int = 4096  # token budget of one packed micro-batch (training pass)
    logprob_micro_batch_tokens: int = 8192  # token budget of one micro-batch (log-prob pass)
    shared_prefix: bool = True  # RL rows hold each group's prompt once (local spec; TE: off)
    threads: int = 0  # torch CPU threads (0: all cores)

    def validate(self) -> None:
        if self.lr <= 0:
            raise ValueError(f"train.lr must be > 0, got {self.lr}")
        if self.steps < 0:
            raise ValueError(f"train.steps must be >= 0, got {self.steps}")
        if self.rollout_budget_groups < 0:
            raise ValueError(
                f"train.rollout_budget_groups must be >= 0 (0: none), got "
                f"{self.rollout_budget_groups}"
            )
        if self.micro_batch_tokens <= 0:
            raise ValueError(f"train.micro_batch_tokens must be > 0, got {self.micro_batch_tokens}")


@dataclass
class SFTConfig:
    """Supervised fine-tuning on prompt/response pairs (loss on response tokens only)."""

    data: str = "reasoning_gym"  # 'reasoning_gym' (generated) or a JSONL path {prompt, response}
    tasks: list[str] = field(default_factory=list)  # reasoning-gym generators to train on
    samples_per_task: int = 2000  # generated training pairs per task
    shuffle: bool = True  # seeded shuffle of the pairs; false: a JSONL file's order (curriculum)
    eval_samples_per_task: int = 100  # held-out pairs per task for accuracy
    batch_size: int = 32  # sequences per optimizer step
    eval_every: int = 0  # steps between held-out evals (0: only at the end)


@dataclass
class RLConfig:
    """GRPO-family objective: advantages, clipped policy loss, KL, entropy, IS correction."""

    group_size: int = 8  # completions per prompt (n)
    prompts_per_step: int = 16  # groups per optimizer step
    advantage: Literal["grpo", "drgrpo", "rloo", "passthrough"] = "grpo"  # estimator
    clip_low: float = 0.2  # ratio lower clip: 1 - clip_low
    clip_high: float = 0.28  # ratio upper clip: 1 + clip_high (clip-higher)
    dual_clip: float | None = None  # dual-clip constant c > 1 for negative advantages (None: off)
    loss_agg: LossAgg = "token_mean"  # token aggregation (megatron_rl/losses.py);
    # seq_mean_token_sum_norm divides by Dr.GRPO's constant normaliser
    max_response_tokens: int = 0  # Dr.GRPO constant, tokens per sequence (0: max_new_tokens)
    kl_coef: float = 0.0  # weight of KL to the frozen reference (0: no reference model)
    kl_estimator: KLEstimator = "k3"  # KL estimator (k1 only as a reward penalty)
    kl_in_reward: bool = False  # subtract kl_coef * sum_t KL_t from each reward, not a loss term
    entropy_coef: float = 0.0  # entropy bonus weight
    tis_cap: float | None = 2.0  # truncated importance sampling cap on pi_train/pi_rollout
    off_policy: bool = False  # overlap generation of step t+1 with training of step t
    max_staleness: int = 1  # max optimizer steps a sample may lag the trainer (checked at load)
    routing_replay: Literal["off", "rollout"] = "off"  # MoE: replay the engine's expert choices
    # in the trainer's forward passes (rollout routing replay, arXiv 2510.11370)
    replay_mismatch_every: int = 1  # with routing replay: steps between extra log-prob passes
    # without replay on the same batch, logged as mismatch/*_no_replay (0: never)

    def validate(self) -> None:
        if self.replay_mismatch_every < 0:
            raise ValueError(
                f"rl.replay_mismatch_every must be >= 0, got {self.replay_mismatch_every}"
            )
        if self.group_size < 1:
            raise ValueError(f"rl.group_size must be >= 1, got {self.group_size}")
        if self.prompts_per_step < 1:
            raise ValueError(f"rl.prompts_per_step must be >= 1, got {self.prompts_per_step}")
        if not (0 <= self.clip_low < 1) or self.clip_high < 0:
            raise ValueError(
                f"rl.clip_low must be in [0, 1) and rl.clip_high >= 0, "
                f"got {self.clip_low}, {self.clip_high}"
            )
        if self.dual_clip is not None and self.dual_clip <= 1:
            raise ValueError(f"rl.dual_clip must be > 1 or null, got {self.dual_clip}")
        if self.tis_cap is not None and self.tis_cap <= 0:
            raise ValueError(f"rl.tis_cap must be > 0 or null, got {self.tis_cap}")
        self._validate_kl()
        if self.max_response_tokens < 0:
            raise ValueError(f"rl.max_response_tokens must be >= 0, got {self.max_response_tokens}")
        if self.max_staleness < 0:
            raise ValueError(f"rl.max_staleness must be >= 0, got {self.max_staleness}")

    def _validate_kl(self) -> None:
        if self.kl_coef < 0:
            raise ValueError(f"rl.kl_coef must be >= 0, got {self.kl_coef}")
        if self.kl_coef > 0 and self.kl_estimator == "k1" and not self.kl_in_reward:
            raise ValueError(
                "rl.kl_estimator=k1 as a loss term has zero gradient in expectation; "
                "use k2 or k3 as a loss, or set rl.kl_in_reward=true for k1 as a reward penalty"
            )


@dataclass
class CheckpointConfig:
    """When and where checkpoints are written; resume is automatic from the run directory."""

    every: int = 10  # optimizer steps between checkpoints (0: only at the end)
    keep: int = 2  # most recent checkpoints kept
    resume: bool = True  # resume from the newest checkpoint in the run directory if present
    preempt_grace_s: float = 0.0  # seconds between a preemption signal and the kill (the Slurm
    # script passes torchrun's --shutdown-timeout); while a step plus its checkpoint takes more
    # than 3/4 of it, every step is checkpointed, so the kill finds one. 0: not known
    allow_legacy: bool = False  # resume a checkpoint of format 1 (before RNG states were plain
    # data): allow-lists numpy's array globals, nothing else, for weights-only loading; only
    # for a run directory you trust (train/checkpoint.py)

    def validate(self) -> None:
        for key in ("every", "keep", "preempt_grace_s"):
            if getattr(self, key) < 0:
                raise ValueError(f"checkpoint.{key} must be >= 0, got {getattr(self, key)}")
