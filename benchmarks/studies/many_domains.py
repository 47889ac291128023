"""The many-domain study (issue 40): one GRPO run over ~300 domains, arms at equal generation.

Registered in docs/scheduler.md ("Hundreds of domains") before any report run. Every run is
``configs/many_domains_cpu.yaml`` (the demo's tiny base, 32 generated groups of 8 per step, the
groups with reward variance trained, no refill and no zero-variance fill) with one arm's
scheduler overrides, a seed and the study's length. Each finished run's extract (per-sweep
per-domain held-out results, per-step generated / trained / with-signal group counts, the
guard's events, timings) is stored in ``many_domains.json.gz`` as soon as it finishes, so a part
can stop and resume; a stored run is reused only under the same settings and arm config.
``many_stats.py`` recomputes every statistic from the stored runs.

Parts (``--part``): ``dev`` (the baseline and the static candidates on the development seeds),
``dev-learned`` (the candidate built from the dev baseline runs), ``headroom`` (the baseline and
the oracle, chosen on the dev seeds, on the report seeds), ``dev-adaptive`` (the adaptive
variants on the dev seeds), ``arms`` (the other registered arms on the report seeds) and
``screened`` (the pre-screen inside the run, alone and with the adaptive mix, beside uniform +
filter, on fresh seeds).
``--quick`` runs a small version into a scratch file (``make test``: three arms, one seed, four
steps, eight domains; no timing).

    .venv/bin/python -m benchmarks.studies.many_domains --part dev
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from benchmarks.harness import OUT, rel
from benchmarks.studies import stored_runs
from benchmarks.studies.many_screen import CONFIG, SCREEN, load_screen
from benchmarks.studies.many_stats import BASELINE, compute, read
from benchmarks.studies.scheduler_runs import even

DOC = Path(__file__).with_name("many_domains.json.gz")
DEV_SEEDS = (1, 2)  # development: the oracle and the adaptive options are chosen here
REPORT_SEEDS = (41, 42, 43, 44, 45, 46, 47, 48)  # fixed 2026-12-05 before any run; never tuned on
SCREENED_SEEDS = tuple(range(49, 57))  # the screened part's fresh seeds (registered 2026-12-05)
STEPS, EVAL_EVERY, GROUP, PER_STEP = 600, 150, 8, 32
QUICK_DOMAINS = [
    "ladder/chain_sum_t2_d1to2",
    "ladder/letter_counting_words3",
    "ladder/gcd_max50",
    "ladder/spell_backward_len5",
    "ladder/count_bits_bits10",
    "ladder/number_format_c2_max99_d5",
    "ladder/lcm_max1000",
    "rg/gcd@0",
]
Arms = dict[str, list[str]]


def static_arm(domains: list[str]) -> list[str]:
    return ["scheduler.policy=static", f"scheduler.weights={json.dumps(even(sorted(domains)))}"]


def candidates(screen: dict[str, Any], doc: dict[str, Any]) -> Arms:
    """The static mixes the oracle is chosen from (on the development seeds)."""
    classes = {d: r["class"] for d, r in screen["domains"].items()}
    out = {
        "static: frontier": static_arm([d for d, c in classes.items() if c == "frontier"]),
        "static: primary": static_arm(screen["primary"]),
    }
    base = doc.get("sections", {}).get("dev", {}).get("runs", {}).get(BASELINE, {})
    if base:  # the domains whose held-out accuracy rose in the dev baseline runs, on average
        gain: dict[str, list[float]] = {}
        for run in base.values():
            first, last = run["sweeps"][0]["acc"], run["sweeps"][-1]["acc"]
            for d in last:
                gain.setdefault(d, []).append(last[d] - first.get(d, 0.0))
        rose = [d for d, g in gain.items() if sum(g) / len(g) > 0]
        out["static: rose on dev"] = static_arm(rose)
    return out


def oracle(doc: dict[str, Any], screen: dict[str, Any]) -> tuple[str, list[str]]:
    """The candidate with the best mean dev primary score (raises before the dev part ran)."""
    stats = compute(doc, screen).get("dev", {}).get("arms", {})
    cands = candidates(screen, doc)
    scored = {a: stats[a]["primary"] for a in cands if a in stats}
    if len(scored) < len(cands):
        raise SystemExit(f"the oracle needs the dev runs of {sorted(set(cands) - set(scored))}")
    best = max(scored, key=lambda a: scored[a])
    return best, cands[best]


ADAPTIVE = ["scheduler.policy=learnability", "scheduler.learn_ucb=0.05"]
ADAPTIVE_DEV = {"adaptive": ADAPTIVE, "adaptive, room": [*ADAPTIVE, "scheduler.learn_room=true"]}
SPLIT = ["rl.prompts_per_step=24", f"scheduler.oversample={4 / 3!r}"]  # 24 mix + 8 refill = 32
HEAT = [
    "scheduler.temperature_adapt=diversity",
    "scheduler.temperature_target=0.5",
    "scheduler.temperature_max=1.5",
]
DAPO = [
    "scheduler.dynamic_sampling=true",
    "scheduler.dynamic_target=8",
    "scheduler.dynamic_max_rounds=8",
]
PRESCREEN_GROUPS = 2  # per domain, charged to the budget
PRESCREEN = "pre-screen"  # its static mix and step count are made per seed (prescreen())


def adaptive_choice(doc: dict[str, Any], screen: dict[str, Any]) -> list[str]:
    """The adaptive variant with the best mean dev primary score."""
    stats = compute(doc, screen).get("dev", {}).get("arms", {})
    scored = {a: stats[a]["primary"] for a in ADAPTIVE_DEV if a in stats}
    if len(scored) < len(ADAPTIVE_DEV):
        raise SystemExit("the arms part needs the dev runs of the adaptive variants first")
    return ADAPTIVE_DEV[max(scored, key=lambda a: scored[a])]


def report_arms(doc: dict[str, Any], screen: dict[str, Any]) -> Arms:
    """The registered arms after headroom (docs/scheduler.md, "Hundreds of domains")."""
    adaptive = adaptive_choice(doc, screen)
    return {
        "uniform": ["scheduler.filter_zero_variance=false"],
        "dynamic sampling, equal generation": [
            *DAPO,
            f"train.rollout_budget_groups={STEPS * PER_STEP}",
        ],
        "dynamic sampling, equal steps": DAPO,
        PRESCREEN: [],
        "adaptive": adaptive,
        "adaptive 24+8": [*adaptive, *SPLIT],
        "adaptive 24+8 + temperature": [*adaptive, *SPLIT, *HEAT],
        "adaptive + guard": [*adaptive, "scheduler.seesaw=true"],
    }


def charged_steps(groups: int) -> int:
    """Steps of generation that ``groups`` pre-screen groups cost (whole steps, rounded up)."""
    return -(-groups // PER_STEP)


def screened_arms(doc: dict[str, Any], screen: dict[str, Any]) -> Arms:
    """The screened part (docs/scheduler.md, "The pre-screen inside the run"): the shipped
    config's pre-screen (``scheduler.prescreen_groups``, its groups charged as whole steps), alone
    and with the adaptive mix, beside uniform + filter, on fresh seeds."""
    charged = charged_steps(PRESCREEN_GROUPS * len(screen["domains"]))
    in_run = [f"scheduler.prescreen_groups={PRESCREEN_GROUPS}", f"train.steps={STEPS - charged}"]
    return {
        BASELINE: [],
        "pre-screen (in the run)": in_run,
        "pre-screen + adaptive": [*in_run, *adaptive_choice(doc, screen)],
    }


def prescreen(seed: int, a: argparse.Namespace) -> tuple[list[str], dict[str, Any]]:
    """The pre-screen arm of one seed: PRESCREEN_GROUPS groups per domain at the base model on
    training prompts (T = 1), then uniform + filter over the domains with reward variance in
    any of them, for the steps the budget has left. The screen is the library's
    (``scheduler.prescreen_groups``, megatron_rl/controller/prescreen.py), run here apart from
    the training run so that its cost comes off the run's steps."""
    import torch

    from megatron_rl.config import load_config
    from megatron_rl.controller.prescreen import prescreen as screen_domains
    from megatron_rl.domains import load_domains
    from megatron_rl.model.tokenizer import load_tokenizer
    from megatron_rl.rollout.build import build_engine

    torch.set_num_threads(1)
    cfg = load_config(CONFIG, overrides([], seed, a))
    domains = load_domains(cfg.domains.include, cfg.domains.exclude)
    engine = build_engine(cfg.rollout, cfg.model.hf_path, seed)
    try:
        screen = screen_domains(
            engine,
            load_tokenizer(cfg.model.hf_path),
            domains,
            groups=PRESCREEN_GROUPS,
            group_size=GROUP,
            seed=seed,
            max_tokens=cfg.rollout.max_new_tokens,
            stop=cfg.rollout.stop,
        )
    finally:
        engine.shutdown()
    spent = charged_steps(screen.groups)
    cfg_list = [*static_arm(screen.kept), f"train.steps={a.steps - spent}"]
    return cfg_list, {"groups": screen.groups, "domains": screen.kept, "steps_charged": spent}


def part_arms(part: str, doc: dict[str, Any], screen: dict[str, Any]) -> tuple[Arms, tuple]:
    cands = candidates(screen, doc)
    if part == "dev":
        arms = {BASELINE: [], **{k: v for k, v in cands.items() if "dev" not in k}}
        return arms, DEV_SEEDS
    if part == "dev-learned":
        if "static: rose on dev" not in cands:
            raise SystemExit("--part dev-learned needs the dev baseline runs (run --part dev)")
        return {"static: rose on dev": cands["static: rose on dev"]}, DEV_SEEDS
    if part == "headroom":
        name, cfg = oracle(doc, screen)
        print(f"oracle (best on the dev seeds): {name}", flush=True)
        return {BASELINE: [], f"oracle ({name})": cfg}, REPORT_SEEDS
    if part == "dev-adaptive":
        return dict(ADAPTIVE_DEV), DEV_SEEDS
    if part == "arms":
        return report_arms(doc, screen), REPORT_SEEDS
    if part == "screened":
        return screened_arms(doc, screen), SCREENED_SEEDS
    raise SystemExit(
        f"--part {part!r}: choose dev, dev-learned, headroom, dev-adaptive, arms or screened"
    )


def overrides(arm: list[str], seed: int, a: argparse.Namespace) -> list[str]:
    out = [
        f"seed={seed}",
        f"train.steps={a.steps}",
        f"eval.every={a.eval_every}",
        "checkpoint.every=0",
        f"tracking.wandb={a.wandb}",
        "tracking.progress=false",
        # the study's baseline, whatever the config now defaults to (its defaults are this
        # study's winners): no pre-screen (the pre-screen arm screens apart), a uniform mix
        "scheduler.prescreen_groups=0",
        "scheduler.policy=uniform",
    ]
    if a.quick:
        out += [f"domains.include={json.dumps(QUICK_DOMAINS)}", "eval.samples_per_domain=8"]
    return out + arm


def run_one(arm: list[str], name: str, seed: int, a: argparse.Namespace) -> Path:
    return stored_runs.train(str(CONFIG), overrides(arm, seed, a), a.run_dir, name)


def extract(run: Path) -> dict[str, Any]:
    """What the statistics need of one run, from its metrics.jsonl and events.jsonl."""
    from megatron_rl.scheduler.curves import read_jsonl

    rows = read_jsonl(run / "metrics.jsonl")
    steps = [r for r in rows if "rollout/groups_generated" in r]
    sweeps = stored_runs.sweeps(rows)
    events = [
        e for e in read_jsonl(run / "events.jsonl") if e.get("event") in ("regression", "recovery")
    ]
    time_of = {
        k: round(sum(r.get(f"time/{k}_s", 0.0) for r in rows), 1)
        for k in ("generate", "train", "eval", "step")
    }
    screen = run / "prescreen.json"  # the run's own pre-screen (scheduler.prescreen_groups)
    kept = json.loads(screen.read_text()) if screen.is_file() else None
    return {
        **({"prescreen": {"groups": kept["groups"], "domains": kept["kept"]}} if kept else {}),
        "sweeps": sweeps,
        "generated": [int(r["rollout/groups_generated"]) for r in steps],
        "trained": [int(r["rollout/groups_trained"]) for r in steps],
        "signal": [int(r["rollout/groups_trained_with_signal"]) for r in steps],
        "events": [{k: e[k] for k in ("step", "event", "domain") if k in e} for e in events],
        "seconds": {
            **time_of,
            "wall": round(json.loads((run / "summary.json").read_text()).get("wall_s", 0.0), 1),
        },
    }


def check_budget(name: str, ex: dict[str, Any], cfg: list[str], steps: int) -> None:
    """The generation budget of every arm, from the run's own metrics: PER_STEP groups a step
    (dynamic sampling: whole rounds of them, at most its round cap), filtering arms train
    exactly their groups with signal (no zero-variance fill), plain uniform every group; no
    competing arm generates more than STEPS x PER_STEP groups (the pre-screen's own included,
    the equal-generation dynamic arm by at most its last step's rounds)."""
    gen, tr, sig = ex["generated"], ex["trained"], ex["signal"]
    dynamic = "scheduler.dynamic_sampling=true" in cfg
    rounds = {g // PER_STEP for g in gen} if all(g % PER_STEP == 0 for g in gen) else {0}
    if (dynamic and not rounds <= set(range(1, 9))) or (not dynamic and set(gen) != {PER_STEP}):
        raise RuntimeError(f"{name}: generated {sorted(set(gen))} groups per step")
    if "scheduler.filter_zero_variance=false" in cfg:
        if tr != gen:
            raise RuntimeError(f"{name}: trained {sorted(set(tr))} of {PER_STEP} groups")
    elif tr != sig or (dynamic and max(tr) > 8):
        raise RuntimeError(f"{name}: trained groups without signal (trained {tr}, signal {sig})")
    total = sum(gen) + ex.get("prescreen", {}).get("groups", 0)
    cap = steps * PER_STEP + (8 * PER_STEP if dynamic else 0)
    if total > cap and not (dynamic and "train.rollout_budget_groups" not in str(cfg)):
        raise RuntimeError(f"{name}: generated {total} groups, more than the budget {cap}")


def settings(a: argparse.Namespace) -> dict[str, Any]:
    return {
        "steps": a.steps,
        "eval_every": a.eval_every,
        "group": GROUP,
        "per_step": PER_STEP,
        "config": rel(str(CONFIG)),
        "quick": a.quick,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", default="dev")
    ap.add_argument("--quick", action="store_true", help="small and fast, into a scratch file")
    ap.add_argument("--seeds", type=int, nargs="*", help="only these of the part's seeds")
    ap.add_argument("--arms", nargs="*", help="only these of the part's arms (names as listed)")
    ap.add_argument("--jobs", type=int, default=2, help="runs at once (one torch thread each)")
    ap.add_argument("--json", default=None, help=f"default: {rel(str(DOC))} (quick: scratch)")
    ap.add_argument("--run-dir", default=str(OUT / "many_domains"))
    ap.add_argument("--wandb", default="disabled")
    a = ap.parse_args(argv)
    a.steps, a.eval_every = (4, 2) if a.quick else (STEPS, EVAL_EVERY)
    path = Path(a.json or (OUT / "many_domains_quick.json.gz" if a.quick else DOC))
    with stored_runs.exclusive(path):  # one runner at a time writes the study's JSON
        return run_part(a, path)


def run_part(a: argparse.Namespace, path: Path) -> int:
    """Run the part's missing runs into ``path`` (under its lock)."""
    doc = read(path) if path.is_file() else {"sections": {}}
    screen = load_screen(SCREEN)
    arms, seeds = part_arms(a.part, doc, screen)
    if a.quick:
        arms = {BASELINE: [], "uniform": ["scheduler.filter_zero_variance=false"], PRESCREEN: []}
        seeds = (1,)
    seeds = tuple(s for s in seeds if not a.seeds or s in a.seeds)
    if a.arms and set(a.arms) - set(arms):
        raise SystemExit(
            f"--arms {sorted(set(a.arms) - set(arms))}: part {a.part} has {list(arms)}"
        )
    name = "dev" if a.part.startswith("dev") else a.part
    sec = stored_runs.section(doc, name, settings(a), arms)  # every arm's config is recorded
    wanted = {k: v for k, v in arms.items() if not a.arms or k in a.arms}
    jobs = stored_runs.todo(sec, wanted, seeds)
    print(f"part {a.part}: {len(jobs)} runs to do ({len(wanted)} arms x seeds {list(seeds)})")

    def attempt(job: stored_runs.Job) -> dict[str, Any]:
        arm, s = job
        cfg, screened = prescreen(s, a) if arm == PRESCREEN else (arms[arm], None)
        ex = extract(run_one(cfg, f"{stored_runs.slug(arm)}-s{s}", s, a))
        if screened:  # the arm's screen ran apart from its run
            ex["prescreen"] = screened
        check_budget(f"{arm} seed {s}", ex, cfg, a.steps)
        return ex

    failed = stored_runs.run_jobs(
        jobs, attempt, sec, doc, path, lambda d: compute(d, screen), a.jobs
    )
    if failed:
        raise SystemExit(f"{len(failed)} of {len(jobs)} runs failed: {failed}")
    from benchmarks.studies.many_report import curves_png, report

    shown = "report" if name == "arms" and "report" in doc["stats"] else name
    print(report(doc, screen, shown))
    if not a.quick:  # the stored study's picture, beside its JSON
        print(curves_png(doc, shown, DOC.with_name(f"many_domains_{shown}_curves.png")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
