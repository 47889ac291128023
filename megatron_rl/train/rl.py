"""The RL loop: sample tasks -> generate -> score -> advantages -> train -> sync -> eval -> save.

This file reads like the algorithm; every stage lives in its own module: the controller
(``megatron_rl/controller/``: scheduler, generation and scoring, advantages, batches, evals,
logging), the data plane between it and the trainer ranks (``data_plane``), the loss and the
optimizer step (``step``), the weight export (``megatron_rl/model/export``) and checkpoints
(``runtime``). Under torchrun, global rank 0 is the one controller and every rank (rank 0 too)
trains on its data-parallel share; docs/distributed.md has the table of who does what.
Re-running the same command resumes from the newest checkpoint, the W&B run included.
SIGTERM/SIGUSR1 (Slurm preemption) on any rank checkpoints at the end of the current step and
exits so the job can be requeued; while steps outlast the time the launcher leaves between the
signal and the kill (``checkpoint.preempt_grace_s``), every step is checkpointed instead.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from tqdm import tqdm

from megatron_rl.config import RunConfig
from megatron_rl.controller.admission import admit
from megatron_rl.controller.controller import Controller
from megatron_rl.evaluation.sweeps import eval_due
from megatron_rl.model.tokenizer import load_tokenizer
from megatron_rl.rollout import weight_group
from megatron_rl.tracking.timer import Timer
from megatron_rl.train.data_plane import (
    agree_any,
    check_lockstep,
    rank_to_dp,
    ship,
)
from megatron_rl.train.preemption import PreemptionFlag, outlasts_grace
from megatron_rl.train.preflight import preflight
from megatron_rl.train.reference import build_reference, reference_logprobs
from megatron_rl.train.runtime import export_hf, save_checkpoint, setup_run
from megatron_rl.train.step import train_step

log = logging.getLogger(__name__)


def train_rl(cfg: RunConfig, overwrite: bool = False) -> dict[str, Any]:
    """Run (or resume) RL training; returns the summary also written to summary.json.
    ``overwrite``: start afresh, replacing a run already in the run directory."""
    if cfg.rollout.sglang.weight_sync == "distributed":  # before any process group exists
        weight_group.contain_nccl_faults()  # a fault in the weight group must not kill rank 0
    # first: a USR1 / SIGTERM during set-up must not kill the rank (checkpoint after a step)
    stop = PreemptionFlag()
    # start-up checks (layout, model, domains, engine, the run directory) first
    model = preflight(cfg, "rl", overwrite)
    # which domains and levels fit this policy (rank 0; domains.strict: refuse before writing)
    main = os.environ.get("RANK", "0") == "0"
    fit = admit(cfg, model, load_tokenizer(model.hf_path)) if main else None
    rt = setup_run(cfg, "rl", model, overwrite)
    engine_dir = export_hf(rt, rt.run_dir / "engine_weights")  # every rank streams, rank 0 writes
    ref = build_reference(rt)
    dp_of = rank_to_dp(rt.dist)
    # the only engine and scheduler; trainer ranks wait on the control group (long timeout)
    ctl = Controller(rt, engine_dir, fit, ref) if fit is not None else None
    bar = tqdm(
        range(rt.start_step, cfg.train.steps),
        desc="rl",
        disable=ctl is None or not cfg.tracking.progress,
        initial=rt.start_step,
        total=cfg.train.steps,
    )
    carry = Timer()  # a step's clock starts where the previous step's metrics were taken
    ckpt_s = 0.0  # how long the last checkpoint took
    for step in bar:
        t = carry
        sd = None  # this step's HF state dict, gathered once for the sync and the checkpoint
        # 1. sample, 2. generate, 3. score, 4. advantages + DP partition: on the controller only
        shares, norm, metrics = ctl.rollout(step, t) if ctl else (None, 0.0, {})
        work = ship(shares, norm, rt.dist, dp_of)  # each rank its DP share
        # the rollout budget spent (train.rollout_budget_groups): this step is the last
        spent = agree_any(ctl.budget_spent() if ctl else False)
        check_lockstep(work.batches, rt.dist, dp_of)  # identical inside every TP/PP/CP group
        # 5. train on packed sequences (every rank, its own share)
        with t("train"):
            if work.train:
                ref_lp = None  # with kl_in_reward the KL is in the rewards, not the loss
                if not cfg.rl.kl_in_reward:
                    ref_lp = reference_logprobs(ref, work.batches)
                metrics.update(
                    train_step(rt.policy, cfg, work.batches, step, ref_lp, work.normalizer)
                )
        # 6. sync weights trainer -> engine, streamed to rank 0 stage by stage, bucket by bucket;
        # also before an eval and after the last step, so evals score the current weights
        last = step == cfg.train.steps - 1 or spent
        evals = eval_due(cfg.eval, step, cfg.train.steps)
        if (step + 1) % cfg.rollout.sync_every == 0 or evals or last:
            with t("sync"):
                sd = rt.policy.hf_state_dict()
                if ctl:
                    metrics.update(ctl.sync(sd, step + 1))
        # 7. evaluate held-out tasks and log (controller), then checkpoint (every rank)
        # (this step's logging and checkpoint count in the next step's row: ``carry``)
        carry = ctl.end_step(step, metrics, t) if ctl else Timer()
        if ctl:
            bar.set_postfix(reward=f"{metrics['rollout/reward_mean']:.3f}")
        stopping = agree_any(stop.requested)
        every = cfg.checkpoint.every and (step + 1) % cfg.checkpoint.every == 0
        # a step too long to finish between a signal and the kill: keep a checkpoint per step
        unsafe = agree_any(outlasts_grace(cfg.checkpoint, time.time() - t.start, ckpt_s, step))
        if last or stopping or every or unsafe:
            with carry("checkpoint"):
                t_ckpt = time.time()
                save_checkpoint(rt, step, ctl.state() if ctl else {}, sd)
                ckpt_s = time.time() - t_ckpt
        if stopping:
            log.warning("preemption signal received: checkpointed step %d, exiting", step)
            return _finish(rt, ctl, step)
        if spent and step + 1 < cfg.train.steps:
            log.info("rollout budget spent after %d steps: the final sweep, then done", step + 1)
            if ctl:
                rt.tracker.event(step, "rollout_budget_spent", groups=ctl.generated)
            return _finish(rt, ctl, None, step + 1)
    return _finish(rt, ctl, None)


def _finish(
    rt: Any, ctl: Controller | None, preempted_at: int | None, steps: int | None = None
) -> dict[str, Any]:
    """The controller's final eval and summary; trainer ranks only close their tracker."""
    if ctl is not None:
        return ctl.finish(preempted_at, steps)
    rt.tracker.finish()
    done = preempted_at is None
    return {"completed": done, **({} if done else {"preempted_at": preempted_at})}
