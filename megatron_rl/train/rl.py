"""The RL loop: sample tasks -> generate -> score -> advantages -> train -> sync -> eval -> save.

This file reads like the algorithm; every stage lives in its own module:
scheduler (``megatron_rl/scheduler``), generation and scoring (``rollout_phase``), advantages and
the loss (``rl_step``), weight sync (``megatron_rl/rollout/weight_sync``), evaluation
(``evaluate``), checkpoints (``runtime``). Re-running the same command resumes from the newest
checkpoint, the W&B run included. SIGTERM/SIGUSR1 (Slurm preemption) checkpoints at the end of
the current step and exits so the job can be requeued.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from tqdm import tqdm

from megatron_rl.config import RunConfig
from megatron_rl.domains import load_domains
from megatron_rl.rewards.monitor import RewardHackingMonitor
from megatron_rl.rollout.weight_sync import sync_weights
from megatron_rl.scheduler import DomainInfo, DomainScheduler
from megatron_rl.train import rl_report as report
from megatron_rl.train.rl_step import build_batches, train_step
from megatron_rl.train.rollout_phase import RolloutProducer, rollout_metrics
from megatron_rl.train.runtime import save_checkpoint, setup_run

log = logging.getLogger(__name__)


def train_rl(cfg: RunConfig) -> dict[str, Any]:
    """Run (or resume) RL training; returns the summary also written to summary.json."""
    rt = setup_run(cfg, "rl")
    domains = load_domains(cfg.domains.include, cfg.domains.exclude, cfg.domains.task_files)
    if not domains:
        raise ValueError("domains.include selects no domain; see `megatron-rl domains list`")
    sched = DomainScheduler(
        cfg.scheduler,
        [DomainInfo(d.name, d.tier, list(d.levels), list(d.tags)) for d in domains.values()],
        cfg.seed,
    )
    state = dict(rt.resumed_state)
    if state:
        sched.load_state_dict(state["scheduler"])
    cursor: dict[str, int] = state.get("cursor", {})
    engine = report.start_engine(rt)
    ref = report.build_reference(rt)
    monitor = RewardHackingMonitor.from_config(cfg.rewards)
    eval_before = state.get("eval_before") or report.run_eval(
        rt, engine, domains, sched, -1, monitor
    )
    wall0 = time.time() - state.get("wall_s", 0.0)
    stop = report.PreemptionFlag()
    producer = RolloutProducer(engine, rt.tokenizer, domains, sched, cursor, cfg)
    bar = tqdm(
        range(rt.start_step, cfg.train.steps),
        desc="rl",
        disable=not rt.is_main or not cfg.tracking.progress,
        initial=rt.start_step,
        total=cfg.train.steps,
    )
    for step in bar:
        t = report.Timer()
        sd = None  # this step's HF state dict, gathered once for the sync and the checkpoint
        # 1. sample tasks from the domain mix, 2. generate n completions per task,
        # 3. score them with each domain's verifier (one step ahead in off-policy mode)
        groups, timing = producer.get(step)
        t.spent.update(generate=timing["generate"], score=timing["score"])
        metrics = {**engine.stats, **getattr(engine, "metrics", {})}  # tokens; SGLang retries
        metrics.update(report.monitor_step(rt, monitor, step, groups))
        results = [g.result() for g in groups]
        events = sched.observe(step, results)
        kept = sched.select(results, cfg.rl.prompts_per_step)
        if cfg.scheduler.filter_zero_variance:  # refill ran out: train on fewer, not on noise
            kept = [i for i in kept if not results[i].zero_variance]
        # 4. advantages + 5. train on packed sequences
        batches, adv_stats = build_batches(
            groups, kept, cfg.rl.advantage, cfg.train.micro_batch_tokens
        )
        metrics.update({**rollout_metrics(groups, kept), **adv_stats})
        metrics["rollout/staleness"] = timing["staleness"]
        with t("train"):
            if batches:
                ref_lp = report.reference_logprobs(ref, batches)
                metrics.update(train_step(rt.policy, cfg, batches, step, ref_lp))
            else:
                rt.tracker.event(step, "empty_batch", groups=len(groups))
        # 6. sync weights trainer -> engine
        if (step + 1) % cfg.rollout.sync_every == 0:
            with t("sync"):
                producer.wait()
                sync_dir = cfg.rollout.sync_dir or rt.run_dir / "sync"
                sd = rt.policy.hf_state_dict()
                metrics.update(sync_weights(engine, sd, cfg.rollout.sync_mode, sync_dir))
                producer.synced()
        # 7. evaluate held-out tasks, then checkpoint
        if cfg.rl.eval_every and (step + 1) % cfg.rl.eval_every == 0 and step + 1 < cfg.train.steps:
            with t("eval"):
                metrics.update(
                    report.run_eval(rt, engine, domains, sched, step, monitor)["metrics"]
                )
        for e in events:
            rt.tracker.event(step, e.pop("event", "scheduler"), **e)
        metrics.update(sched.metrics())
        metrics.update(t.metrics(metrics))
        rt.tracker.log(step, metrics)
        report.log_samples(rt, step, groups)
        bar.set_postfix(reward=f"{metrics['rollout/reward_mean']:.3f}")
        last = step == cfg.train.steps - 1
        if (
            last
            or stop.requested
            or (cfg.checkpoint.every and (step + 1) % cfg.checkpoint.every == 0)
        ):
            save_checkpoint(
                rt,
                step,
                {
                    "scheduler": sched.state_dict(),
                    "cursor": cursor,
                    "eval_before": eval_before,
                    "wall_s": time.time() - wall0,
                },
                sd,
            )
        if stop.requested:
            log.warning("preemption signal received: checkpointed step %d, exiting", step)
            producer.close()
            return report.finish(rt, engine, {"completed": False, "preempted_at": step})
    producer.close()
    eval_after = report.run_eval(rt, engine, domains, sched, cfg.train.steps, monitor)
    summary = report.summarize(rt, eval_before, eval_after, time.time() - wall0)
    return report.finish(rt, engine, summary)
