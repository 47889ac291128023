"""The RL loop's supporting cast: engine start-up, reference model, timing, signals, samples.

The evals and the summary live in ``rl_eval``.
"""

from __future__ import annotations

import logging
import signal
import time
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from long_context.packing import PackedBatch
from megatron_rl.model.policy import Policy
from megatron_rl.rewards.monitor import RewardHackingMonitor
from megatron_rl.rollout.base import RolloutEngine, build_engine
from megatron_rl.rollout.process_engine import oversubscribed, resolve
from megatron_rl.train.runtime import Runtime, export_hf

log = logging.getLogger(__name__)


def start_engine(rt: Runtime, weights: Path) -> RolloutEngine:
    """Start the configured engine on HF-layout weights (the controller's, global rank 0 only)."""
    t0 = time.time()
    cfg = rt.cfg
    rollout = resolve(cfg.rollout, cfg.rl.off_policy, cfg.train.threads)
    if rollout.process == "own" and (warning := oversubscribed(cfg.train.threads, rollout.threads)):
        log.warning(warning)
    if cfg.rl.routing_replay == "rollout":  # the engine returns the experts it chose
        rollout = replace(rollout, return_routed_experts=True)
    engine = build_engine(rollout, str(weights), cfg.seed)
    log.info("rollout engine %r ready in %.1f s", cfg.rollout.engine, time.time() - t0)
    return engine


def build_reference(rt: Runtime) -> Policy | None:
    """A frozen copy of the starting policy, only when a KL term needs it."""
    if rt.cfg.rl.kl_coef <= 0:
        return None
    ref = Policy(rt.cfg.model, rt.dist, None)
    from megatron_rl.model import hf_io

    # the reference is the run's starting point: the HF checkpoint, or the exported random init
    src = rt.cfg.model.hf_path or str(rt.run_dir / "reference_init")
    if not rt.cfg.model.hf_path and rt.start_step == 0:
        export_hf(rt, src)  # collective; rank 0 writes, every rank then reads it
        if torch.distributed.is_initialized():
            torch.distributed.barrier()
    sd, _ = hf_io.load_hf(src)
    ref.load_hf_state_dict(sd)
    return ref


def eval_due(cfg: Any, step: int) -> bool:
    """A periodic held-out eval follows this step (the final one is after the loop)."""
    every = cfg.rl.eval_every
    return bool(every) and (step + 1) % every == 0 and step + 1 < cfg.train.steps


def reference_logprobs(ref: Policy | None, batches: list[PackedBatch]) -> list[torch.Tensor] | None:
    if ref is None:
        return None
    return [lp for lp, _ in ref.token_logprobs(batches)]


def monitor_step(
    rt: Runtime, monitor: RewardHackingMonitor, step: int, groups: list[Any]
) -> dict[str, float]:
    """Feed one step's samples to the reward-hacking monitor; new warnings become events."""
    by_domain: dict[str, list[tuple[float, str, str]]] = {}
    for g in groups:
        for s in g.samples:
            by_domain.setdefault(g.spec.domain, []).append((s.reward, s.text, g.task.id))
    seen = monitor.n_warnings
    metrics: dict[str, float] = {}
    for domain, rows in sorted(by_domain.items()):
        rewards, answers, ids = zip(*rows, strict=True)
        metrics.update(monitor.observe(step, domain, rewards, answers, ids))
    new = min(monitor.n_warnings - seen, len(monitor.samples))
    for sample in list(monitor.samples)[len(monitor.samples) - new :]:
        # the event has its own step and kind: the sample's kind is the warning's
        fields = {k: v for k, v in sample.items() if k not in ("step", "kind")}
        rt.tracker.event(step, "reward_hacking_warning", warning=sample.get("kind"), **fields)
    return metrics


class Timer:
    """Wall time per phase of a step; the remainder of the step is reported as 'other'.

    The RL loop starts a step's Timer where the previous step's metrics were taken, so that
    step's logging and checkpoint (which run after its row is written) count in the next row as
    ``time/log_s`` and ``time/checkpoint_s``: consecutive ``time/step_s`` add up to the loop's wall
    time, the way a trainer callback's step-end to step-end intervals do.
    """

    def __init__(self) -> None:
        self.start = time.time()
        self.start_cpu = time.process_time()
        self.spent: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str):  # type: ignore[no-untyped-def]
        t0 = time.time()
        try:
            yield
        finally:
            self.spent[name] = self.spent.get(name, 0.0) + time.time() - t0

    def metrics(self, step_metrics: dict[str, float]) -> dict[str, float]:
        total = time.time() - self.start
        out = {f"time/{k}_s": v for k, v in self.spent.items()}
        out["time/step_s"] = total
        out["time/step_cpu_s"] = time.process_time() - self.start_cpu  # this process, all threads
        out["time/other_s"] = max(0.0, total - sum(self.spent.values()))
        gen_tokens = step_metrics.get("rollout/response_len_mean", 0.0) * step_metrics.get(
            "rollout/samples", 0.0
        )
        if self.spent.get("generate"):
            out["perf/generated_tokens_per_s"] = gen_tokens / self.spent["generate"]
        return out


class PreemptionFlag:
    """Set by SIGTERM / SIGUSR1 (what Slurm sends before the time limit or on preemption)."""

    def __init__(self) -> None:
        self.requested = False
        for sig in (signal.SIGTERM, signal.SIGUSR1):
            try:
                signal.signal(sig, self._handle)
            except ValueError:  # not the main thread (e.g. under a test runner thread)
                pass

    def _handle(self, signum: int, frame: Any) -> None:
        log.warning("received signal %d: will checkpoint after this step", signum)
        self.requested = True


GRACE_SHARE = 0.75  # a step plus its checkpoint must fit in this share of the grace period
_warned_grace: set[int] = set()


def outlasts_grace(cfg: Any, step_s: float, ckpt_s: float, step: int) -> bool:
    """This step plus a checkpoint takes longer than ``checkpoint.preempt_grace_s`` allows:
    a signal in the next step could not be answered with a checkpoint before the kill."""
    grace = cfg.checkpoint.preempt_grace_s
    if not grace or step_s + ckpt_s <= GRACE_SHARE * grace:
        return False
    if not _warned_grace:
        log.warning(
            "step %d took %.1f s (+ %.1f s checkpoint), more than %.0f%% of "
            "checkpoint.preempt_grace_s=%.0f: checkpointing every step while that lasts",
            step, step_s, ckpt_s, 100 * GRACE_SHARE, grace,
        )  # fmt: skip
        _warned_grace.add(step)
    return True


def log_samples(rt: Runtime, step: int, groups: list[Any]) -> None:
    """A few trajectories per log as a W&B table (and samples.jsonl)."""
    k = rt.cfg.tracking.samples_per_log
    if k <= 0 or step % max(1, rt.cfg.tracking.log_every) != 0:
        return
    rows = [
        [g.spec.domain, g.task.prompt[:500], s.text[:500], g.task.gold[:200], s.reward]
        for g in groups[:k]
        for s in g.samples[:1]
    ]
    rt.tracker.table(step, "samples", ["domain", "prompt", "response", "gold", "reward"], rows)


def finish(rt: Runtime, engine: RolloutEngine, summary: dict[str, Any]) -> dict[str, Any]:
    rt.tracker.finish()
    engine.shutdown()
    return summary
