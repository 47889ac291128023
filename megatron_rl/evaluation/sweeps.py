"""The RL loop's evals: fixed distinct-prompt sets, periodic sweeps, and the run's summary.

Built once at start-up (``RLEval``), so a split too small for the request is reported once:

- the held-out set: ``eval.samples_per_domain`` distinct eval-split prompts per domain, scored
  at every sweep with the primary metric (greedy, or sampled pass@1 with
  ``eval.samples_per_prompt`` samples at ``eval.temperature``); its per-prompt scores feed
  the seesaw guard, so the guard's bootstrap unit is the distinct prompt;
- with ``eval.greedy_also`` and a sampled primary metric, a greedy pass on the same prompts
  (``eval_greedy/*``), the secondary metric;
- the training-prompt sample: ``eval.train_prompts`` distinct training prompts per domain,
  scored at the start and the end only (``eval_train/*``); the memorisation gap is its accuracy
  minus the held-out accuracy.

``summarize`` writes summary.json: per domain the distinct counts, accuracy before/after with
standard errors, the paired before/after difference with its standard error (same prompts, so
the pairing removes prompt difficulty), the training-prompt accuracies and the gaps.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from typing import Any

from megatron_rl.config import RunConfig
from megatron_rl.config.eval import EvalConfig
from megatron_rl.domains import Domain
from megatron_rl.domains.guard import DomainGuard
from megatron_rl.domains.jsonl import append_eval_failures
from megatron_rl.durable import write_atomic
from megatron_rl.evaluation.evaluate import EvalResult, evaluate, mean_stderr, paired_difference
from megatron_rl.evaluation.prompt_sets import Drawing, PromptSet, build_prompt_set
from megatron_rl.rewards.monitor import RewardHackingMonitor
from megatron_rl.rollout.base import RolloutEngine
from megatron_rl.run import Run
from megatron_rl.scheduler import DomainScheduler
from megatron_rl.scheduler.curves import curves_png
from megatron_rl.scheduler.heatmap import heatmap_png
from megatron_rl.scheduler.radar import domain_group


class RLEval:
    """The prompt sets of a run and how its sweeps score them."""

    def __init__(
        self,
        cfg: RunConfig,
        domains: dict[str, Domain],
        drawing: Drawing | None = None,
        guard: DomainGuard | None = None,
    ) -> None:
        ev = cfg.eval
        self.cfg, self.domains, self.guard = cfg, domains, guard
        level = cfg.domains.level
        n = ev.samples_per_domain
        self.held_out = build_prompt_set(domains, n, cfg.seed, level, drawing=drawing)
        n_train = ev.samples_per_domain if ev.train_prompts < 0 else ev.train_prompts
        self.train: PromptSet | None = None
        if n_train:
            self.train = build_prompt_set(domains, n_train, cfg.seed, level, "train", drawing)
        self.constant = constant_baseline(self.held_out)

    def score(
        self, engine: RolloutEngine, tokenizer: Any, prompts: PromptSet, greedy: bool = False
    ) -> EvalResult:
        """One pass over ``prompts`` with the primary metric (or greedy)."""
        ev = self.cfg.eval
        return evaluate(
            engine,
            tokenizer,
            self.domains,
            prompts.requested,
            self.cfg.seed,
            self.cfg.rollout.max_new_tokens,
            stop=self.cfg.rollout.stop,
            samples=1 if greedy else ev.samples_per_prompt,
            temperature=0.0 if greedy else ev.temperature,
            prompts=prompts,
            guard=self.guard,
        )

    @property
    def greedy_also(self) -> bool:
        return bool(self.cfg.eval.greedy_also and self.cfg.eval.temperature > 0)


def constant_baseline(prompts: PromptSet) -> dict[str, float]:
    """Per domain, the held-out accuracy of always giving one answer: the share of the most
    common gold. A policy that collapses to that answer scores this much without any skill
    (letter counting: "1" is the gold of ~60-70% of prompts)."""
    out = {}
    for name, tasks in prompts.tasks.items():
        if tasks:
            golds = Counter(t.gold.strip() for t in tasks)
            out[name] = golds.most_common(1)[0][1] / len(tasks)
    return out


def run_eval(
    rt: Run,
    engine: RolloutEngine,
    evals: RLEval,
    sched: DomainScheduler,
    step: int,
    monitor: RewardHackingMonitor | None = None,
    with_train: bool = False,
) -> dict[str, Any]:
    """A sweep at the current weights (``with_train``: also the training-prompt sample); feeds
    the seesaw guard; logs and returns results (what the controller checkpoints of it)."""
    at = max(step, 0)
    res = evals.score(engine, rt.tokenizer, evals.held_out)
    metrics = res.metrics("eval")
    out: dict[str, Any] = {"accuracy": res.accuracy, "mean": res.mean, "result": res.to_json()}
    out["constant"] = evals.constant
    if evals.greedy_also:
        greedy = evals.score(engine, rt.tokenizer, evals.held_out, greedy=True)
        metrics.update(greedy.metrics("eval_greedy"))
        out["greedy"] = greedy.to_json()
    if with_train and evals.train is not None:
        train = evals.score(engine, rt.tokenizer, evals.train)
        metrics.update(train.metrics("eval_train"))
        for name, acc in train.accuracy.items():
            if name in res.accuracy:
                metrics[f"eval_train/{name}/gap"] = acc - res.accuracy[name]
        out["train"] = train.to_json()
    for name, acc in res.accuracy.items():
        if monitor is not None:
            monitor.observe_eval(at, name, acc)
    for e in sched.observe_eval(at, res.scores):
        rt.tracker.event(at, e.pop("event", "seesaw"), **e)
    if rt.is_main:
        png = sched.radar_png(rt.run_dir / "radar.png")
        rt.tracker.image(at, "eval/radar", png)
        if (
            rt.cfg.domains.eval_failures
        ):  # off: nothing written (hundreds of domains: ~10 MB a sweep)
            append_eval_failures(rt.run_dir, at, res.records)
    rt.tracker.log(at, metrics)
    if rt.is_main:  # drawn from metrics.jsonl / events.jsonl, so after this sweep is logged
        rt.tracker.image(at, "eval/curves", curves_png(rt.run_dir))
        families = {d.name: domain_group(d) for d in sched.domains}
        rt.tracker.image(at, "eval/heatmap", heatmap_png(rt.run_dir, groups=families))
    out["metrics"] = metrics
    return out


def _f(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else round(x, 6)


def _paired(b: dict[str, Any], a: dict[str, Any], name: str) -> dict[str, Any]:
    """The paired before/after difference of one domain (same prompts) and its SE."""
    gain, se = paired_difference(b["scores"][name], a["scores"][name])
    z = None  # gain in standard errors; undefined when every prompt moved alike (SE 0)
    if math.isfinite(se) and se > 0:
        z = gain / se
    elif gain == 0:
        z = 0.0
    return {
        "stderr_before": _f(b["stderr"][name]),
        "gain": _f(gain),
        "gain_stderr": _f(se),
        "gain_z": _f(z),
        # the acceptance test of a demo: no domain may fall by more than 2 standard errors
        "drop_beyond_2se": bool(gain < -2 * se) if math.isfinite(se) else None,
    }


def domain_rows(before: dict[str, Any], after: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per domain: distinct counts, before/after with SEs, paired gain, train-prompt accuracy."""
    b, a = before.get("result"), after.get("result")
    rows: dict[str, dict[str, Any]] = {}
    for name in sorted(after["accuracy"]):
        row: dict[str, Any] = {"before": _f(before["accuracy"].get(name))}
        row["after"] = _f(after["accuracy"][name])
        if a is not None:
            row["distinct"] = len(a["scores"][name])
            row["requested"] = a["requested"]
            row["stderr_after"] = _f(a["stderr"][name])
            if b is not None and name in b["scores"]:
                row.update(_paired(b, a, name))
            for key, res in (("before", b), ("after", a)):
                if res is not None and name in res.get("top_answer_share", {}):
                    row[f"top_answer_share_{key}"] = _f(res["top_answer_share"][name])
        if name in after.get("constant", {}):
            row["constant_baseline"] = _f(after["constant"][name])
        for key, ref in (("before", before), ("after", after)):
            t = ref.get("train")
            if t is not None and name in t["accuracy"]:
                row["train_distinct"] = len(t["scores"][name])
                row[f"train_{key}"] = _f(t["accuracy"][name])
                if ref["accuracy"].get(name) is not None:
                    row[f"gap_{key}"] = _f(t["accuracy"][name] - ref["accuracy"][name])
        rows[name] = row
    return rows


def summarize(
    rt: Run,
    before: dict[str, Any],
    after: dict[str, Any],
    wall_s: float,
    step: int,
    domains: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """summary.json, the before/after table printed at the end, and the same table in W&B.
    ``domains``: what the fit check left out and the run quarantined (``domain_health``)."""
    rows = domain_rows(before, after)
    ses = [r["gain_stderr"] for r in rows.values() if r.get("gain_stderr") is not None]
    zs = [r["gain_z"] for r in rows.values() if r.get("gain_z") is not None]
    ev = rt.cfg.eval
    summary: dict[str, Any] = {
        "eval_before": before["accuracy"],
        "eval_after": after["accuracy"],
        "mean_before": before["mean"],
        "mean_after": after["mean"],
        "mean_gain": after["mean"] - before["mean"],
        "mean_gain_stderr": _f(mean_stderr(ses)) if len(ses) == len(rows) else None,
        "worst_gain_z": min(zs) if zs else None,
        "domains_below_2se": [n for n, r in rows.items() if r.get("drop_beyond_2se")],
        "metric": {
            "samples_per_prompt": ev.samples_per_prompt,
            "temperature": ev.temperature,
        },
        "domains": rows,
    }
    for key, res in (("before", before.get("train")), ("after", after.get("train"))):
        if res is not None:
            accs = list(res["accuracy"].values())
            summary[f"train_mean_{key}"] = sum(accs) / max(1, len(accs))
    for key, res in (("before", before.get("greedy")), ("after", after.get("greedy"))):
        if res is not None:
            summary[f"greedy_{key}"] = res["accuracy"]
    summary.update(steps=step, wall_s=round(wall_s, 1), run_dir=str(rt.run_dir))
    summary["completed"] = True
    if domains is not None:
        summary["domain_health"] = domains
    if rt.is_main:
        write_atomic(rt.run_dir / "summary.json", json.dumps(summary, indent=2))
        print(format_table(summary))
        if domains is not None:
            print(format_health(domains))
        table = [[n, *(r.get(k) for k in TABLE_KEYS)] for n, r in rows.items()]
        rt.tracker.table(step, "eval_summary", ["domain", *TABLE_KEYS], table)
    return summary


TABLE_KEYS = ["distinct", "before", "after", "gain", "gain_stderr"]
TABLE_KEYS += ["train_before", "train_after", "gap_before", "gap_after"]
TABLE_KEYS += ["constant_baseline", "top_answer_share_before", "top_answer_share_after"]


def format_table(summary: dict[str, Any]) -> str:
    """The end-of-run table: per domain prompts, before/after, paired gain (SE), train, gap."""
    rows = summary["domains"]
    width = max([len(n) for n in rows] + [6])
    head = "prompts  before   after    gain (SE)    train b/a  gap b/a     const  top b/a"
    lines = [f"{'domain':<{width}}  {head}"]
    for n, r in rows.items():
        lines.append(
            f"{n:<{width}}  {r.get('distinct', 0):7d}  {_num(r['before'])}  {_num(r['after'])}  "
            f"{_num(r.get('gain'), '+6.3f')} ({_num(r.get('gain_stderr'), '5.3f')})  "
            f"{_num(r.get('train_before'), '4.2f')}/{_num(r.get('train_after'), '4.2f')}  "
            f"{_num(r.get('gap_before'), '+4.2f')}/{_num(r.get('gap_after'), '+4.2f')}  "
            f"{_num(r.get('constant_baseline'), '5.3f')}  "
            f"{_num(r.get('top_answer_share_before'), '4.2f')}/"
            f"{_num(r.get('top_answer_share_after'), '4.2f')}"
        )
    b, a, gain = summary["mean_before"], summary["mean_after"], summary["mean_gain"]
    se = _num(summary.get("mean_gain_stderr"), "5.3f")
    lines.append(f"{'MEAN':<{width}}  {'':7s}  {b:6.3f}  {a:6.3f}  {gain:+6.3f} ({se})")
    m = summary["metric"]
    how = "greedy accuracy"
    if m["temperature"] > 0:
        how = f"pass@1 of {m['samples_per_prompt']} samples at T={m['temperature']}"
    lines.append(
        f"held-out {how}, each distinct prompt once; steps {summary['steps']}, "
        f"wall {summary['wall_s']:.0f} s, run dir {summary['run_dir']}"
    )
    lines.append(
        "const: held-out accuracy of always giving the most common gold answer; top: share of "
        "prompts given the most common answer (1.00: one answer for every prompt)"
    )
    return "\n".join(lines)


def _num(x: float | None, fmt: str = "6.3f") -> str:
    if x is None:
        return "n/a".rjust(len(format(0.0, fmt)))
    return format(x, fmt)


def eval_due(ev: EvalConfig, step: int, steps: int) -> bool:
    """A periodic held-out eval follows ``step`` of ``steps`` (the final one is after the loop)."""
    every = ev.every
    return bool(every) and (step + 1) % every == 0 and step + 1 < steps


def format_health(h: dict[str, Any]) -> str:
    """The end-of-run lines on domains left out at start-up, quarantined, or failing."""
    left, quarantined = len(h["left_out"]), len(h["quarantined"])
    out = [f"domains: {h['admitted']} admitted, {left} levels left out, {quarantined} quarantined"]
    for x in h["left_out"]:
        level = "" if x["level"] is None else f" level {x['level']}"
        out.append(f"  left out {x['domain']}{level}: {x['reason']}: {x['detail']}")
    for name, why in h["quarantined"].items():
        out.append(f"  quarantined {name}: {why}")
    failing = {d: f for d, f in h["failures"].items() if d not in h["quarantined"]}
    for name, per in failing.items():
        out.append(f"  failures {name}: " + ", ".join(f"{k} {v}" for k, v in sorted(per.items())))
    return "\n".join(out)
