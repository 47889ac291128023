"""Scoring throughput: answers/s of the serial verifier path vs the process pool, one run.

Builds ``--answers`` (task, response) pairs spread over every registered domain: per domain a
two tasks at its easiest level, each answered a dozen ways (gold bare, tagged, with
reasoning; wrong, empty, unicode noise, 5 kB of junk), so every verifier runs on both its pass
and its fail path. Then scores the same pairs twice:

- serial: ``VerifierPool(0)``, ``Domain.verify`` inline in this process;
- pooled: ``VerifierPool(--workers)`` worker processes (started and warmed before timing;
  the start-up time is printed apart).

Code domains run every answer as a real program (sandbox, or its subprocess fallback), so they
dominate the serial time; the per-family breakdown shows where the time goes.

    .venv/bin/python -m benchmarks.scoring [--answers 10000] [--workers N] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

from megatron_rl.domains import Task, VerifyResult, load_domains
from megatron_rl.domains.pool import VerifierPool

TASKS_PER_DOMAIN = 2  # task generation is slow for some generators; answers vary instead


def answers_for(t: Task, multi_turn: bool) -> list[str]:
    """Twelve responses: five that should pass, seven that should fail (wrong, empty, noise)."""
    gold = t.meta["gold_actions"][-1] if multi_turn else t.gold
    return [
        gold,
        f"<answer>{t.gold}</answer>",
        f"I worked it out.\n<answer>{t.gold}</answer>",
        f"  {gold}  ",
        f"<answer>wrong</answer> then <answer>{t.gold}</answer>",
        "zzq wrong answer",
        "",
        "<answer></answer>",
        "I am not sure.",
        "\u4e00\u4e8c\u4e09 \U0001f600",
        "x" * 5000,
        f"<answer>{t.gold[::-1]}#</answer>",
    ]


def build_pairs(n_answers: int) -> list[tuple[Task, str]]:
    """``n_answers`` pairs, round-robin over domains (``TASKS_PER_DOMAIN`` tasks each)."""
    domains = load_domains()
    per_task = -(-n_answers // (TASKS_PER_DOMAIN * len(domains)))
    rows: list[list[tuple[Task, str]]] = []
    for d in domains.values():
        for i in range(TASKS_PER_DOMAIN):
            t = d.task("train", i, seed=0)
            answers = answers_for(t, d.multi_turn)
            rows.append([(t, answers[k % len(answers)]) for k in range(per_task)])
    pairs = [row[k] for k in range(per_task) for row in rows]  # interleave domains
    return pairs[:n_answers]


def family_times(pairs: list[tuple[Task, str]], results: list[VerifyResult]) -> dict[str, float]:
    """Seconds per family, from each serial verdict's own ``duration_s``."""
    out: dict[str, float] = defaultdict(float)
    for (t, _), r in zip(pairs, results, strict=True):
        out[t.domain.split("/", 1)[0]] += r.duration_s
    return dict(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--answers", type=int, default=10_000, help="answers to score")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="pool processes")
    ap.add_argument("--json", default=None, help="also write the measurements here")
    args = ap.parse_args()

    t0 = time.perf_counter()
    pairs = build_pairs(args.answers)
    n_domains = len({t.domain for t, _ in pairs})
    print(
        f"machine: {os.cpu_count()} cores; {len(pairs)} answers over {n_domains} domains "
        f"(built in {time.perf_counter() - t0:.1f} s)"
    )

    serial = VerifierPool(0)
    t0 = time.perf_counter()
    s_res = serial.verify(pairs)
    t_serial = time.perf_counter() - t0

    t0 = time.perf_counter()
    pool = VerifierPool(args.workers)
    pool.verify(pairs[: args.workers * pool.chunk_size])  # start and warm every worker
    t_start = time.perf_counter() - t0
    t0 = time.perf_counter()
    p_res = pool.verify(pairs)
    t_pooled = time.perf_counter() - t0
    pool.close()

    agree = sum(a.score == b.score for a, b in zip(s_res, p_res, strict=True))
    fam = family_times(pairs, s_res)
    print(f"serial: {t_serial:.1f} s, {len(pairs) / t_serial:.0f} answers/s")
    print(
        f"pooled ({args.workers} workers): {t_pooled:.1f} s, {len(pairs) / t_pooled:.0f} "
        f"answers/s (pool start-up {t_start:.1f} s, not counted)"
    )
    print(
        f"ratio pooled/serial answers/s: {t_serial / t_pooled:.2f}x; "
        f"verdicts agree on {agree}/{len(pairs)}"
    )
    print(
        "serial verify seconds by family: "
        + ", ".join(f"{k} {v:.1f}" for k, v in sorted(fam.items(), key=lambda kv: -kv[1]))
    )
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(
            json.dumps(
                {
                    "cores": os.cpu_count(),
                    "answers": len(pairs),
                    "domains": n_domains,
                    "workers": args.workers,
                    "serial_s": t_serial,
                    "pooled_s": t_pooled,
                    "pool_startup_s": t_start,
                    "ratio": t_serial / t_pooled,
                    "agree": agree,
                    "family_serial_s": fam,
                },
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
