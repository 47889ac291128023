"""Held-out accuracy per difficulty level, before and after an RL run (``eval.levels``).

For long-context domains a level is a context length, so this is accuracy against length. At the
start of a run and after its last step the controller scores ``eval.samples_per_level``
distinct held-out prompts per domain at each level of ``eval.levels`` (greedy, each prompt
scored once, the same prompts both times: the harness's prompt set of a fixed level is a pure
function of domains, count, level and seed; ``evaluation/prompt_sets.py``). Per level it
reports the accuracy pooled over the domains, its standard error over prompts, the number of
distinct prompts scored, the paired after - before difference with its standard error (same
prompts, so prompt difficulty cancels) and, per domain, the accuracy. The curriculum's promotions
(scheduler events) go beside them, and :func:`accuracy_png` draws accuracy against length.

The sweep runs beside the run's periodic eval (``domains.level``, the seesaw guard's input),
not instead of it: it never follows the curriculum and is not fed to the scheduler.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from megatron_rl.domains import Domain
from megatron_rl.durable import write_atomic
from megatron_rl.evaluation.evaluate import evaluate, paired_difference, stderr_of
from megatron_rl.model.tokenizer import prompt_ids
from megatron_rl.rollout.base import RolloutEngine


def stderr(values: list[float]) -> float | None:
    """Standard error of the mean over prompts (the harness's); None below two values."""
    se = stderr_of(values)
    return se if math.isfinite(se) else None


def level_sweep(
    engine: RolloutEngine,
    tokenizer: Any,
    domains: dict[str, Domain],
    levels: list[int],
    n: int,
    seed: int,
    max_tokens: int,
    stop: list[str] | None = None,
) -> dict[str, Any]:
    """Per level: the mean prompt length in tokens and, for every domain that has the level,
    the prompt ids and per-prompt scores (JSON-ready: it is checkpointed with the run)."""
    out: dict[str, Any] = {}
    for level in levels:
        having = {k: d for k, d in domains.items() if level in d.levels}
        if not having:
            raise ValueError(f"eval.levels: no selected domain has level {level}")
        res = evaluate(engine, tokenizer, having, n, seed, max_tokens, level=level, stop=stop)
        per: dict[str, dict[str, list[Any]]] = {}
        lengths = []
        for task, _, score in res.records:
            entry = per.setdefault(task.domain, {"ids": [], "scores": []})
            entry["ids"].append(task.id)
            entry["scores"].append(float(score))
            lengths.append(len(prompt_ids(tokenizer, task.prompt)))
        out[str(level)] = {"prompt_tokens": sum(lengths) / len(lengths), "domains": per}
    return out


def _pooled(sweep: dict[str, Any]) -> tuple[list[str], list[float]]:
    per = sweep["domains"]
    ids = [i for k in sorted(per) for i in per[k]["ids"]]
    scores = [s for k in sorted(per) for s in per[k]["scores"]]
    return ids, scores


def level_report(
    before: dict[str, Any], after: dict[str, Any], promotions: list[dict[str, Any]]
) -> dict[str, Any]:
    """The per-level block of summary.json (see the module docstring)."""
    rows = []
    for key in before:
        ids_b, sb = _pooled(before[key])
        ids_a, sa = _pooled(after[key])
        if ids_b != ids_a:
            raise ValueError(f"level {key}: the before and after sweeps scored different prompts")
        gain, gain_se = paired_difference(sb, sa)
        level = int(key)
        rows.append(
            {
                "level": level,
                "tokens": round(before[key]["prompt_tokens"]),
                "distinct": len(set(ids_b)),
                "scored": len(ids_b),
                "before": sum(sb) / len(sb),
                "after": sum(sa) / len(sa),
                "before_stderr": stderr(sb),
                "after_stderr": stderr(sa),
                "gain": gain,
                "gain_stderr": gain_se if math.isfinite(gain_se) else None,
                "per_domain": {
                    d: {
                        "before": sum(v["scores"]) / len(v["scores"]),
                        "after": sum(after[key]["domains"][d]["scores"]) / len(v["scores"]),
                        "distinct": len(set(v["ids"])),
                    }
                    for d, v in sorted(before[key]["domains"].items())
                },
            }
        )
    reached = max((p["to_level"] for p in promotions), default=None)
    return {"levels": rows, "promotions": promotions, "highest_level_reached": reached}


def format_levels(report: dict[str, Any]) -> str:
    lines = ["level  tokens  distinct  before (se)      after (se)       gain (se)"]
    for r in report["levels"]:
        lines.append(
            f"{r['level']:>5}  {r['tokens']:>6}  {r['distinct']:>8}  "
            f"{r['before']:.3f} ({r['before_stderr'] or 0:.3f})  "
            f"{r['after']:.3f} ({r['after_stderr'] or 0:.3f})  "
            f"{r['gain']:+.3f} ({r['gain_stderr'] or 0:.3f})"
        )
    for p in report["promotions"]:
        lines.append(
            f"step {p['step']}: {p['domain']} {p['event']} {p['from_level']} -> {p['to_level']}"
            f" (pass rate {p['pass_rate']:.2f})"
        )
    return "\n".join(lines)


def accuracy_png(report: dict[str, Any], path: str | Path, title: str = "") -> Path:
    """Accuracy against context length, before and after, with +-1 SE bars; promotions marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["levels"]
    x = [r["tokens"] for r in rows]
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for key, label, style in (("before", "start of RL", "o--"), ("after", "end of RL", "s-")):
        y = [r[key] for r in rows]
        err = [r[f"{key}_stderr"] or 0.0 for r in rows]
        ax.errorbar(x, y, yerr=err, fmt=style, capsize=3, label=label)
    reached = {p["to_level"] for p in report["promotions"]} | {
        p["from_level"] for p in report["promotions"]
    }
    for r in rows:
        if r["level"] in reached:
            ax.axvline(r["tokens"], color="grey", alpha=0.15, lw=6)
    ax.set_xscale("log", base=2)
    ax.set_xticks(x, [f"{t // 1024}k" if t >= 1024 else str(t) for t in x])
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("context length (tokens); shaded: levels the curriculum trained at")
    ax.set_ylabel("held-out accuracy (greedy)")
    n = min((r["distinct"] for r in rows), default=0)
    ax.set_title(title or f"held-out accuracy per length, >= {n} distinct prompts per level")
    ax.legend(loc="upper right")
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def write_summary(run_dir: Path, summary: dict[str, Any]) -> None:
    write_atomic(run_dir / "summary.json", json.dumps(summary, indent=2))
