"""Reward composition and sandbox settings."""

from __future__ import annotations

from dataclasses import dataclass, field

from megatron_rl.rewards.judge import JudgeConfig
from megatron_rl.rewards.reward_model import RewardModelConfig


@dataclass
class RewardsConfig:
    """Run-wide reward settings: the sandbox and the reward-hacking monitor.

    How a verdict becomes a reward (outcome, process, format and length terms) is set per
    domain by its ``RewardWeights`` (``megatron_rl/domains/base.py``, composed by
    ``megatron_rl/domains/reward.py``).
    """

    truncated_reward: float | None = None  # reward for truncated responses (None: score as is)
    sandbox_timeout_s: float = 10.0  # wall-time limit per code execution
    sandbox_memory_mb: int = 512  # memory limit per sandboxed process and, with a cgroup, sandbox
    sandbox_workers: int = 0  # parallel sandbox executions (0: number of cores)
    allow_unsandboxed: bool = False  # run code without isolation (loudly logged; never default)
    sandbox_max_procs: int = 8  # processes (and threads) per sandboxed program
    sandbox_max_output_kb: int = 1024  # stdout + stderr beyond this kills the execution, KiB
    monitor_window: int = 20  # steps per window compared by the reward-jump check
    monitor_jump_threshold: float = 0.25  # rise of the windowed mean reward that is a jump
    monitor_eval_ratio: float = 0.5  # eval must rise by this fraction of the jump to explain it
    monitor_cluster_min_tasks: int = 3  # distinct tasks sharing one answer before it is flagged
    monitor_cluster_frac: float = 0.3  # ... and the fraction of the batch's tasks they make up
    monitor_min_answer_chars: int = 20  # shorter answers (e.g. "42") are never clustered
    monitor_divergence_threshold: float = 0.05  # the verifier's reward of model-scored samples
    # falling by this, while the model reward fell by less than half as much, is flagged ...
    monitor_divergence_window: int = 5  # ... comparing this many steps with as many before
    # constraints (megatron_rl/rewards/constraints.py): a hard_violation gets the domain's
    # hard_floor (violation_floor), and/or each named constraint a Lagrange multiplier that
    # rises while its violation rate is over its budget and falls while under
    violation_floor: bool = True  # a hard_violation's reward is the domain's hard_floor
    violation_floor_value: float | None = None  # that reward in every domain instead (e.g. 0:
    # a violation zeroes the reward); None: each domain's own hard_floor
    constraints: dict[str, float] = field(default_factory=dict)  # name -> budget (share of its
    # samples allowed to violate it), e.g. {hard_violation: 0.05}
    constraint_lr: float = 1.0  # multiplier change per step per unit of (rate - budget)
    constraint_init: float = 0.0  # multiplier at the start
    constraint_kp: float = 0.0  # proportional gain: the multiplier is kp x (rate - budget) plus
    # the integral that constraint_lr moves (0: plain dual ascent; see constraints.py)
    constraint_max: float = 10.0  # multiplier cap
    judge: JudgeConfig = field(default_factory=JudgeConfig)  # a generative judge's reward term
    # (megatron_rl/rewards/judge.py); off while judge.model is ""
    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)  # a learned
    # reward model's term (megatron_rl/rewards/reward_model.py); off while model and server are ""

    def validate(self) -> None:
        import math

        from megatron_rl.rewards.constraints import Multipliers

        v = self.violation_floor_value
        if v is not None and not (isinstance(v, (int, float)) and math.isfinite(v)):
            raise ValueError(
                f"rewards.violation_floor_value must be a finite number or null, got {v!r}"
            )

        Multipliers(
            self.constraints,
            self.constraint_lr,
            self.constraint_init,
            self.constraint_max,
            self.constraint_kp,
        )
