"""The constructed seesaw pair (``scheduler_real.py --part seesaw``), docs/scheduler.md.

``tinysched/gcd`` (A: the GCD of two numbers up to 100) and ``tinysched/gcd_plus_one`` (B: the
same questions, answer the GCD plus one) disagree on every item and the prompt cannot tell them
apart (domains/tiny_sched.py); both have reward signal at the start.

Arms, on ``ABLATION_SEEDS``, the main benchmark's budget, sweeps every ``EVAL_EVERY`` steps on
``EVAL_PROMPTS`` distinct held-out prompts per domain (4 samples at T = 1):

* ``train A only``: a static mix with no B groups; both domains are evaluated. The pair is
  *valid* when A's sampled pass@1 rises and B's falls, each by more than 3 standard errors.
* ``adaptive`` and ``adaptive, no guard``: the adaptive scheduler on the pair, with and
  without the guard's reaction (the guard runs and flags in both; only the first boosts B).

What is measured (``scheduler_stats.seesaw``): the *onset*, the first sweep at which B is more
than 2 SE below its start; the sweep of the guard's first ``regression`` event for B (caught
when within two sweeps of the onset); and when B is back within 2 SE of its start, with and
without the guard. ``docs/scheduler_seesaw.png`` draws B and A against step per seed, both
adaptive arms, the onset and the guard's events.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import scheduler_real as sr
import scheduler_stats as stats

PAIR = ("tinysched/gcd", "tinysched/gcd_plus_one")  # (A, B): B is the one that drops
STEPS, EVAL_EVERY, EVAL_PROMPTS = 40, 5, 256
ROLES = {"a_only": "train A only", "guard": "adaptive", "no_guard": "adaptive, no guard"}
ARMS: sr.Arms = {
    ROLES["a_only"]: sr.static({PAIR[0]: 1.0, PAIR[1]: 0.0}),
    ROLES["guard"]: [*sr.ADAPTIVE, "scheduler.seesaw=true"],
    ROLES["no_guard"]: [*sr.ADAPTIVE, "scheduler.seesaw=false"],
}


def pair_args(a: argparse.Namespace) -> argparse.Namespace:
    """The benchmark's arguments with the pair's domains, sweeps and eval size."""
    e = argparse.Namespace(**vars(a))
    e.domains = list(PAIR)
    if not a.quick:
        e.steps, e.eval_every, e.eval_n = STEPS, EVAL_EVERY, EVAL_PROMPTS
    return e


def main(a: argparse.Namespace, out: Path) -> int:
    from scheduler_report import draw_seesaw

    e = pair_args(a)
    seeds = sr.subset_seeds(sr.DEV_SEEDS[:1] if a.quick else sr.ABLATION_SEEDS, a.seeds)
    doc = json.loads(out.read_text()) if out.is_file() else {}
    sec = sr.section(doc, "quick-seesaw" if a.quick else "seesaw", e)
    sec.update(kind="seesaw", pair=list(PAIR), roles=ROLES, arms=ARMS)
    arms = {k: v for k, v in ARMS.items() if not a.arms or k in a.arms}
    t0 = time.time()
    sr.run_arms(arms, seeds, e, sec["runs"], lambda: sr.write(out, doc))
    sec["stats"] = json.loads(json.dumps(stats.compute(sec)))
    sec.setdefault("wall_s", {})["seesaw"] = round(time.time() - t0, 1)
    sr.write(out, doc)
    png = draw_seesaw(sec, Path(a.seesaw_png))
    print(json.dumps(summary(sec["stats"]), indent=1))
    print(f"wrote {out} (seesaw) and {png}")
    return 0


def summary(st: dict[str, Any]) -> dict[str, Any]:
    """The verdicts, without the per-seed detail."""
    keys = ("valid_all_seeds", "seeds_with_onset", "caught", "back_sooner")
    return {k: st[k] for k in keys}
