"""The constructed seesaw pair (``scheduler_real.py --part seesaw``), docs/scheduler.md.

``tinysched/gcd`` (A: the GCD of two numbers up to 100) and ``tinysched/gcd_plus_100`` (B: the
same questions, answer the GCD plus 100) disagree on every item, the prompt cannot tell them
apart and no answer pays under both (domains/tiny_sched.py). Every arm starts from
``models/tiny-seesaw-base`` (``make seesaw-base``), where both have reward signal.

Arms, on ``ABLATION_SEEDS``, the main benchmark's budget, sweeps every ``EVAL_EVERY`` steps on
``EVAL_PROMPTS`` distinct held-out prompts per domain (4 samples at T = 1):

* ``train A only``: a static mix with no B groups; both domains are evaluated. The pair is
  *valid* when A's sampled pass@1 rises and B's falls, each by more than 3 standard errors.
* ``A-heavy, guard`` and ``A-heavy, no guard``: a static mix that gives B ``B_SHARE`` of the
  groups (a mix weighted toward A, as a user might weight a domain they care about), with and
  without the guard's reaction (the guard runs and flags in both; only the first boosts B's
  score by ``BOOST`` while B is flagged). The adaptive scheduler on the pair alone does not make
  a seesaw: on development seed 1 it kept B's share at 0.42-0.63 and B rose (docs/scheduler.md),
  so the guard is tested where the mix does hurt B. ``B_SHARE``, ``BOOST`` and the sweep
  interval were chosen on development seed 1 (``scheduler_pair_dev.json``): with B at
  1/8 or 1/4 of the mix, or sweeps every 5 steps, B is at 0 before the guard can flag it twice,
  and a domain at pass rate 0 yields no GRPO signal to come back with.

What is measured (``scheduler_stats.seesaw``): the *onset*, the first sweep at which B is more
than 2 SE below its start; the sweep of the guard's first ``regression`` event for B (caught
when within two sweeps of the onset); and when B is back within 2 SE of its start, with and
without the guard. ``docs/scheduler_seesaw.png`` draws B and A against step per seed, the
guarded and unguarded arms and "train A only", the onset and the guard's events.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import read_text
from benchmarks.studies import scheduler_runs as sr
from benchmarks.studies import scheduler_stats as stats
from benchmarks.studies.stored_runs import write

PAIR = ("tinysched/gcd", "tinysched/gcd_plus_100")  # (A, B): B is the one that drops
MODEL = sr.PAIR_MODEL  # `make seesaw-base`; the default --model of --part seesaw
B_SHARE = 0.33  # B's share of the A-heavy mix (development seed 1, docs/scheduler.md)
BOOST = 10.0  # the guard's reaction: B's mix score x BOOST while flagged (development seed 1)
STEPS, EVAL_EVERY, EVAL_PROMPTS = 40, 2, 256  # sweeps every 2 steps: B collapses within ~10
ROLES = {"a_only": "train A only", "guard": "A-heavy, guard", "no_guard": "A-heavy, no guard"}
A_HEAVY = sr.static({PAIR[0]: 1.0 - B_SHARE, PAIR[1]: B_SHARE})
ARMS: sr.Arms = {
    ROLES["a_only"]: sr.static({PAIR[0]: 1.0, PAIR[1]: 0.0}),
    ROLES["guard"]: [*A_HEAVY, "scheduler.seesaw=true", f"scheduler.seesaw_boost={BOOST}"],
    ROLES["no_guard"]: [*A_HEAVY, "scheduler.seesaw=false"],
}


def pair_args(a: argparse.Namespace) -> argparse.Namespace:
    """The benchmark's arguments with the pair's domains, sweeps and eval size."""
    e = argparse.Namespace(**vars(a))
    e.domains = list(PAIR)
    if not a.quick:
        e.steps, e.eval_every, e.eval_n = STEPS, EVAL_EVERY, EVAL_PROMPTS
    return e


def main(a: argparse.Namespace, out: Path) -> int:
    from benchmarks.studies.scheduler_report import draw_seesaw

    e = pair_args(a)
    dev = bool(a.seeds) and set(a.seeds) <= set(sr.DEV_SEEDS)  # development: its own section
    pool = sr.DEV_SEEDS[:1] if a.quick else sr.DEV_SEEDS if dev else sr.ABLATION_SEEDS
    seeds = sr.subset_seeds(pool, a.seeds)
    doc = json.loads(read_text(out)) if out.is_file() else {}
    name = "quick-seesaw" if a.quick else "dev-seesaw" if dev else "seesaw"
    sec = sr.section(doc, name, e)
    arms = {k: v for k, v in ARMS.items() if not a.arms or k in a.arms}
    sr.forget_changed(sec, arms)
    sec.update(kind="seesaw", pair=list(PAIR), roles=ROLES)
    t0 = time.time()
    sr.run_arms(arms, seeds, e, sec["runs"], lambda: write(out, doc))
    sec["stats"] = json.loads(json.dumps(stats.compute(sec)))
    sec.setdefault("wall_s", {})["seesaw"] = round(time.time() - t0, 1)
    write(out, doc)
    png = draw_seesaw(sec, Path(a.seesaw_png))
    print(json.dumps(summary(sec["stats"]), indent=1))
    print(f"wrote {out} (seesaw) and {png}")
    return 0


def summary(st: dict[str, Any]) -> dict[str, Any]:
    """The verdicts, without the per-seed detail."""
    keys = ("valid_all_seeds", "seeds_with_onset", "caught", "back_sooner")
    return {k: st[k] for k in keys}
