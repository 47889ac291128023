"""The RL loop's supporting cast: engine start-up, reference model, eval, timing, summary."""

from __future__ import annotations

import json
import logging
import signal
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from long_context.packing import PackedBatch
from megatron_rl.domains import Domain
from megatron_rl.domains.jsonl import append_eval_failures
from megatron_rl.model.policy import Policy
from megatron_rl.rewards.monitor import RewardHackingMonitor
from megatron_rl.rollout.base import RolloutEngine, build_engine
from megatron_rl.rollout.process_engine import oversubscribed, resolve
from megatron_rl.scheduler import DomainScheduler
from megatron_rl.scheduler.curves import curves_png
from megatron_rl.train.evaluate import evaluate
from megatron_rl.train.runtime import Runtime, export_hf

log = logging.getLogger(__name__)


def start_engine(rt: Runtime, weights: Path) -> RolloutEngine:
    """Start the configured engine on HF-layout weights (the controller's, global rank 0 only)."""
    t0 = time.time()
    cfg = rt.cfg
    rollout = resolve(cfg.rollout, cfg.rl.off_policy, cfg.train.threads)
    if rollout.process == "own" and (warning := oversubscribed(cfg.train.threads, rollout.threads)):
        log.warning(warning)
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


def run_eval(
    rt: Runtime,
    engine: RolloutEngine,
    domains: dict[str, Domain],
    sched: DomainScheduler,
    step: int,
    monitor: RewardHackingMonitor | None = None,
) -> dict[str, Any]:
    """Held-out sweep at the current weights; feeds the seesaw guard; logs and returns results."""
    cfg = rt.cfg
    res = evaluate(
        engine,
        rt.tokenizer,
        domains,
        cfg.rl.eval_samples_per_domain,
        cfg.seed,
        cfg.rollout.max_new_tokens,
        level=cfg.domains.level,
        stop=cfg.rollout.stop,
    )
    metrics = res.metrics()
    for name, acc in res.accuracy.items():
        if monitor is not None:
            monitor.observe_eval(max(step, 0), name, acc)
    for e in sched.observe_eval(max(step, 0), res.scores):
        rt.tracker.event(max(step, 0), e.pop("event", "seesaw"), **e)
    if rt.is_main:
        png = sched.radar_png(rt.run_dir / "radar.png")
        rt.tracker.image(max(step, 0), "eval/radar", png)
        append_eval_failures(rt.run_dir, max(step, 0), res.records)
    rt.tracker.log(max(step, 0), metrics)
    if rt.is_main:  # drawn from metrics.jsonl / events.jsonl, so after this sweep is logged
        rt.tracker.image(max(step, 0), "eval/curves", curves_png(rt.run_dir))
    return {"accuracy": res.accuracy, "mean": res.mean, "metrics": metrics}


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


def summarize(
    rt: Runtime, before: dict[str, Any], after: dict[str, Any], wall_s: float
) -> dict[str, Any]:
    """summary.json and the before/after table printed at the end of a run."""
    summary = {
        "eval_before": before["accuracy"],
        "eval_after": after["accuracy"],
        "mean_before": before["mean"],
        "mean_after": after["mean"],
        "mean_gain": after["mean"] - before["mean"],
        "steps": rt.cfg.train.steps,
        "wall_s": round(wall_s, 1),
        "run_dir": str(rt.run_dir),
        "completed": True,
    }
    if rt.is_main:
        (rt.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        print(format_table(summary))
    return summary


def format_table(summary: dict[str, Any]) -> str:
    names = sorted(summary["eval_before"])
    width = max([len(n) for n in names] + [6])
    lines = [f"{'domain':<{width}}  before   after   delta"]
    for n in names:
        b, a = summary["eval_before"][n], summary["eval_after"].get(n, float("nan"))
        lines.append(f"{n:<{width}}  {b:6.3f}  {a:6.3f}  {a - b:+6.3f}")
    b, a = summary["mean_before"], summary["mean_after"]
    lines.append(f"{'MEAN':<{width}}  {b:6.3f}  {a:6.3f}  {a - b:+6.3f}")
    lines.append(
        f"steps {summary['steps']}, wall {summary['wall_s']:.0f} s, run dir {summary['run_dir']}"
    )
    return "\n".join(lines)


def finish(rt: Runtime, engine: RolloutEngine, summary: dict[str, Any]) -> dict[str, Any]:
    rt.tracker.finish()
    engine.shutdown()
    return summary
