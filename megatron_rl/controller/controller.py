"""The RL controller: global rank 0's half of every step (see docs/distributed.md).

One process, global rank 0, owns everything that talks to the outside or decides what to train
on: the rollout engine (or the SGLang router client), the domain scheduler and task cursors, the
verifier pool, the reward-hacking monitor, the evals, the tracker and the samples log. Per step
it plans, generates, scores, selects and computes advantages once, splits the kept groups over
the DP ranks by tokens (``controller/batches.build_batches``) and hands the shares to
``train/data_plane.ship``. Trainer ranks (every rank, rank 0 included) then train on their share;
rank 0 receives the streamed HF weights and pushes them to the engine.

No other rank builds an engine, opens a server connection, runs the scheduler or writes a shared
file. The controller's state (scheduler, cursors, eval baseline, wall time) goes into rank 0's
checkpoint file only; its RNG state is rank 0's, saved with every rank's as before.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from megatron_rl.controller.admission import Admission, prompt_fits
from megatron_rl.controller.batches import build_batches, kl_reward_penalties, shared_prefix_enabled
from megatron_rl.controller.engine import finish, start_engine
from megatron_rl.controller.generate import RolloutProducer, rollout_metrics
from megatron_rl.controller.monitoring import log_samples, monitor_step
from megatron_rl.controller.prescreen import prescreen
from megatron_rl.domains.guard import DomainGuard
from megatron_rl.durable import write_atomic
from megatron_rl.evaluation import levels as level_eval
from megatron_rl.evaluation.prompt_cache import PromptCache
from megatron_rl.evaluation.prompt_sets import Drawing
from megatron_rl.evaluation.sweeps import RLEval, eval_due, run_eval, summarize
from megatron_rl.losses import drgrpo_constant, global_normalizer
from megatron_rl.packing.batch import PackedBatch
from megatron_rl.rewards.constraints import Multipliers, count_violations
from megatron_rl.rewards.judge import Judge
from megatron_rl.rewards.monitor import RewardHackingMonitor
from megatron_rl.rewards.reward_model import RewardModel
from megatron_rl.rollout.groups import Group
from megatron_rl.rollout.weight_sync import sync_weights
from megatron_rl.run import Run
from megatron_rl.scheduler import DomainInfo, DomainScheduler
from megatron_rl.tracking.timer import Timer

log = logging.getLogger(__name__)


class Controller:
    """Rollout, scoring, selection, advantages, DP partition, weight push, evals and logging."""

    def __init__(self, rt: Run, engine_dir: Path, admission: Admission, ref: Any = None) -> None:
        cfg = rt.cfg
        self.rt, self.cfg = rt, cfg
        self.ref = ref  # the frozen reference, for KL as a reward penalty (rl.kl_in_reward)
        self.admission = admission  # the domains that fit the policy, and those left out
        self.domains = admission.domains
        assert admission.workers is not None
        self.guard = DomainGuard(admission.workers, cfg.domains, admission.limit)
        infos = [
            DomainInfo(d.name, d.tier, list(d.levels), list(d.tags)) for d in self.domains.values()
        ]
        self.sched = DomainScheduler(cfg.scheduler, infos, cfg.seed)
        state = dict(rt.resumed_state)
        if state:
            self.sched.load_state_dict(state["scheduler"])
            self.guard.health.load_state_dict(state.get("health", {}))
        self.cursor: dict[str, int] = state.get("cursor", {})
        self.generated = int(state.get("generated_groups", 0))  # the rollout budget's count
        r = cfg.rewards
        self.prices = Multipliers(
            r.constraints, r.constraint_lr, r.constraint_init, r.constraint_max, r.constraint_kp
        )  # the constraints' Lagrange multipliers (megatron_rl/rewards/constraints.py)
        self.prices.load_state_dict(state.get("constraints", {}))
        self.scorers: list[Judge | RewardModel] = []  # model-based rewards
        if r.judge.model:
            self.scorers.append(Judge(r.judge, cfg.seed))
        if r.reward_model.model or r.reward_model.server:
            self.scorers.append(RewardModel(r.reward_model))
        routes = cfg.rl.routing_replay == "rollout" or cfg.rollout.return_routed_experts
        self.shared_prefix = shared_prefix_enabled(cfg.train.shared_prefix, routes)
        clock = [time.time()]

        def lap() -> float:
            clock.append(time.time())
            return round(clock[-1] - clock[-2], 1)

        self.evals = RLEval(cfg, self.domains, self._drawing(), self.guard)  # fixed prompt sets
        self.startup = {"fit_check_s": round(admission.seconds, 1), "prompt_sets_s": lap()}
        self.engine = start_engine(rt, engine_dir)
        self.startup["engine_s"] = lap()
        self.monitor = RewardHackingMonitor.from_config(cfg.rewards)
        self.eval_before = state.get("eval_before") or self.evaluate(-1, with_train=True)
        self.levels_before = state.get("levels_before") or self.level_sweep()
        self.startup["eval_before_s"] = lap()
        # the pre-screen runs once, at a fresh start; a resumed run keeps its result
        self.screen = state.get("prescreen", {}) if state else self._prescreen()
        if self.screen and not state:
            self.startup["prescreen_s"] = lap()
        elif state and cfg.scheduler.prescreen_groups and not self.screen:
            log.warning(
                "scheduler.prescreen_groups is set, but this run started without a "
                "pre-screen: it resumes without one (the screen runs before step 0 only)"
            )
        log.info("start-up, seconds: %s", self.startup)
        self.wall0 = time.time() - state.get("wall_s", 0.0)
        self.producer = RolloutProducer(
            self.engine,
            rt.tokenizer,
            self.domains,
            self.sched,
            self.cursor,
            cfg,
            self.guard,
            rt.start_step,
            self.prices,
            self.scorers,
        )
        self.groups: list[Group] = []
        self.events: list[dict[str, Any]] = []

    def _drawing(self) -> Drawing:
        """How the eval prompt sets are drawn: in the domain workers, under the budget, through
        the cache, keeping only prompts the policy can hold."""
        d = self.cfg.domains
        fits = prompt_fits(self.rt.tokenizer, self.admission.limit)
        return Drawing(
            self.guard.workers,
            budget_s=d.prompt_budget_s,
            timeout_s=d.task_timeout_s,
            cache=PromptCache(d.cache) if d.cache else None,
            fits=lambda t: fits(t.prompt),
        )

    def _prescreen(self) -> dict[str, Any]:
        """``scheduler.prescreen_groups`` groups per domain at the base policy, once, before step
        0: the domains without reward variance leave the mix (controller/prescreen.py). Charged
        to the rollout budget; the result goes in the checkpoint and ``prescreen.json``."""
        cfg = self.cfg
        if cfg.scheduler.prescreen_groups <= 0:
            return {}
        temps = dict(zip(self.sched.names, self.sched.temperatures(), strict=True))
        fits = prompt_fits(self.rt.tokenizer, self.admission.limit)
        screen = prescreen(
            self.engine,
            self.rt.tokenizer,
            self.domains,
            groups=cfg.scheduler.prescreen_groups,
            group_size=cfg.rl.group_size,
            seed=cfg.seed,
            max_tokens=cfg.rollout.max_new_tokens,
            temperature=lambda name: float(temps[name]),
            stop=cfg.rollout.stop,
            draw=self.guard.tasks,
            verify=self.guard.verify,
            fits=lambda t: fits(t.prompt),
        )
        dropped = sorted(set(self.domains) - set(screen.kept))
        for name in dropped:
            self.sched.exclude(name)
        self.generated += screen.groups
        out = {**screen.to_json(), "dropped": dropped}
        write_atomic(self.rt.run_dir / "prescreen.json", json.dumps(out, indent=1) + "\n")
        self.rt.tracker.event(
            0,
            "prescreen",
            groups=screen.groups,
            kept=len(screen.kept),
            dropped=len(dropped),
            unscreened=len(screen.unscreened),
        )
        return out

    def rollout(
        self, step: int, t: Timer
    ) -> tuple[list[list[PackedBatch]], float, dict[str, float]]:
        """Steps 1-4 once for the whole world: per-DP-rank micro-batches, normaliser, metrics."""
        cfg = self.cfg
        # 1. sample tasks from the domain mix, 2. generate n completions per task,
        # 3. score them with each domain's verifier (one step ahead in off-policy mode)
        self._quarantine(step)  # (an eval may have quarantined a domain)
        generated, timing = self.producer.get(step)
        t.spent.update(generate=timing["generate"], score=timing["score"])
        groups = [g for g in generated if not g.failed]  # a failing domain's group is dropped
        metrics = {**self.engine.stats, **getattr(self.engine, "metrics", {})}
        if step == self.rt.start_step:  # the start-up's parts, once, in the first row
            metrics.update({f"startup/{k}": v for k, v in self.startup.items()})
        self.generated += len(groups)
        if self.prices.budgets:  # this step's violation rates move the multipliers
            declared = {n: d.constraints for n, d in self.domains.items()}
            seen = [(s.domain, s.violations) for g in groups for s in g.samples]
            metrics.update(self.prices.update(count_violations(seen, declared)))
        metrics["rollout/groups_generated_total"] = self.generated
        for sc in self.scorers:
            metrics.update(sc.metrics())
        dropped = len(generated) - len(groups) + int(timing["undrawn"])
        metrics["rollout/groups_dropped"] = dropped
        self._quarantine(step)
        metrics.update(self.guard.health.metrics())
        metrics.update(monitor_step(self.rt, self.monitor, step, groups, self._model_scored))
        results = [g.result(cfg.rl.advantage) for g in groups]
        self.events = self.sched.observe(step, results)
        if cfg.scheduler.dynamic_sampling:  # the first groups with signal, up to the target
            target = cfg.scheduler.dynamic_target or cfg.rl.prompts_per_step
            kept = [i for i, r in enumerate(results) if not r.filterable][:target]
            metrics["rollout/rounds"] = timing.get("rounds", 1.0)
        else:
            kept = self.sched.select(results, min(len(results), cfg.rl.prompts_per_step))
        # refill ran out: train on fewer (default), or on the zero-variance fill (``fill_batch``:
        # advantage 0, so only the loss normaliser sees it; every step trains the same count)
        if cfg.scheduler.filter_zero_variance and not cfg.scheduler.fill_batch:
            kept = [i for i in kept if not results[i].filterable]
        # 4. advantages (KL to the reference as a reward penalty first, if asked), then the
        # kept groups split over the DP ranks by tokens
        penalty = None
        if cfg.rl.kl_in_reward and self.ref is not None and kept:
            penalty, kl_stats = kl_reward_penalties(
                self.ref,
                groups,
                kept,
                cfg.rl,
                budget=cfg.train.logprob_micro_batch_tokens,
                shared_prefix=self.shared_prefix,
            )
            metrics.update(kl_stats)
        shares, adv_stats = build_batches(
            groups,
            kept,
            estimator=cfg.rl.advantage,
            budget=cfg.train.micro_batch_tokens,
            dp=self.rt.dist.dp,
            reward_penalty=penalty,
            shared_prefix=self.shared_prefix,
        )
        metrics.update({**rollout_metrics(groups, kept), **adv_stats})
        # failed verifications, in the dropped groups too
        metrics["rollout/verifier_errors"] = sum(
            s.verifier_error for g in generated for s in g.samples
        )
        metrics["rollout/staleness"] = timing["staleness"]
        if not kept:
            self.rt.tracker.event(step, "empty_batch", groups=len(groups))
        self.groups = groups
        constant = drgrpo_constant(cfg.rl, cfg.rollout.max_new_tokens)
        return shares, global_normalizer(shares, cfg.rl.loss_agg, constant), metrics

    def _model_scored(self, domain: str) -> bool:
        """Whether a judge or a reward model scores ``domain``'s samples."""
        return any(sc.applies(domain) for sc in self.scorers)

    def _quarantine(self, step: int) -> None:
        """Newly quarantined domains: the mix plans them no more; one event each."""
        for e in self.guard.health.take_events():
            self.sched.exclude(e["domain"])
            self.rt.tracker.event(step, e.pop("event"), **e)

    def sync(self, hf_sd: dict[str, Any], optimizer_steps: int) -> dict[str, float]:
        """Push the weights after ``optimizer_steps`` steps to the engine (after a prefetched
        rollout has finished)."""
        self.producer.wait()
        sync_dir = self.cfg.rollout.sync_dir or self.rt.run_dir / "sync"
        out = sync_weights(self.engine, hf_sd, self.cfg.rollout.sync_mode, sync_dir)
        self.producer.synced(optimizer_steps)
        return out

    def evaluate(self, step: int, with_train: bool = False) -> dict[str, Any]:
        rt, sched = self.rt, self.sched
        return run_eval(rt, self.engine, self.evals, sched, step, self.monitor, with_train)

    def level_sweep(self) -> dict[str, Any]:
        """Held-out scores per level of ``eval.levels`` (empty without it)."""
        cfg = self.cfg
        if not cfg.eval.levels:
            return {}
        return level_eval.level_sweep(
            self.engine,
            self.rt.tokenizer,
            self.domains,
            cfg.eval.levels,
            n=cfg.eval.samples_per_level,
            seed=cfg.seed,
            max_tokens=cfg.rollout.max_new_tokens,
            stop=cfg.rollout.stop,
        )

    def end_step(self, step: int, metrics: dict[str, float], t: Timer) -> Timer:
        """7. the periodic eval, then the step's events, metrics and samples.

        Returns the next step's Timer, started when this step's metrics were taken: the logging
        here (and the loop's checkpoint) count in the next row as ``time/log_s``.
        """
        # the loop synced the weights before a periodic eval
        if eval_due(self.cfg.eval, step, self.cfg.train.steps):
            with t("eval"):
                self.producer.wait()  # never share the engine with a prefetching thread
                metrics.update(self.evaluate(step)["metrics"])
        for e in self.events:
            self.rt.tracker.event(step, e.pop("event", "scheduler"), **e)
        metrics.update(self.sched.metrics())
        if step % self.cfg.tracking.domain_metrics_every and "eval/mean_accuracy" not in metrics:
            metrics = without_domain_rows(metrics, self.domains)
        metrics.update(t.metrics(metrics))
        carry = Timer()
        with carry("log"):
            self.rt.tracker.log(step, metrics)
            log_samples(self.rt, step, self.groups)
        return carry

    def state(self) -> dict[str, Any]:
        """What the controller checkpoints (once, in rank 0's file)."""
        return {
            "scheduler": self.sched.state_dict(),
            "cursor": self.cursor,
            "eval_before": self.eval_before,
            "levels_before": self.levels_before,
            "wall_s": time.time() - self.wall0,
            "health": self.guard.health.state_dict(),
            "generated_groups": self.generated,
            "prescreen": self.screen,
            "constraints": self.prices.state_dict(),
        }

    def budget_spent(self) -> bool:
        """The run's groups generated reached ``train.rollout_budget_groups`` (if set)."""
        budget = self.cfg.train.rollout_budget_groups
        return budget > 0 and self.generated >= budget

    def finish(self, preempted_at: int | None, steps: int | None = None) -> dict[str, Any]:
        """Final eval and summary (or the preemption record); shuts the engine down. ``steps``:
        the steps trained when the rollout budget ended the run early."""
        self.producer.close()
        for sc in self.scorers:
            sc.close()
        if preempted_at is not None:
            self.guard.close()
            return finish(self.rt, self.engine, {"completed": False, "preempted_at": preempted_at})
        steps = self.cfg.train.steps if steps is None else steps
        after = self.evaluate(steps, with_train=True)
        self._quarantine(steps)  # a domain quarantined in the final sweep gets its event too
        self.guard.close()
        health = {**self.admission.summary(), **self.guard.health.summary()}
        wall = time.time() - self.wall0
        summary = summarize(self.rt, self.eval_before, after, wall, steps, health)
        if self.levels_before:  # accuracy per level, before and after, and the promotions
            promotions = [e for e in self.sched.events if e.get("event") in ("promote", "demote")]
            levels = level_eval.level_report(self.levels_before, self.level_sweep(), promotions)
            summary.update(levels=levels, wall_s=round(time.time() - self.wall0, 1))
            level_eval.write_summary(self.rt.run_dir, summary)
            level_eval.accuracy_png(levels, self.rt.run_dir / "accuracy_vs_length.png")
            print(level_eval.format_levels(levels))
        return finish(self.rt, self.engine, summary)


def without_domain_rows(metrics: dict[str, float], domains: Iterable[str]) -> dict[str, float]:
    """``metrics`` less its per-domain keys (``<prefix>/<domain>/<name>``): the aggregates stay."""
    names = set(domains)

    def per_domain(key: str) -> bool:
        parts = key.split("/")
        return any("/".join(parts[1:k]) in names for k in range(2, len(parts)))

    return {k: v for k, v in metrics.items() if not per_domain(k)}
