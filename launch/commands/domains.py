"""``megatron-rl domains``: list, show and check the installed task domains; export failures.

    megatron-rl domains list [PATTERN...] [--json]
    megatron-rl domains show NAME [--samples N] [--level L]
    megatron-rl domains check [PATTERN...] [--samples N] [--sample-domains K] [--no-sizes]
    megatron-rl domains export-failures RUN_DIR [--out FILE]

Plugin errors (a plugin that fails to import, duplicate names) are printed to stderr, naming the
plugin; the other domains still work. ``check`` exits 1 on any contract failure or plugin error.

``check`` also measures each (domain, level)'s room (``megatron_rl/domains/sizes.py``): the
distinct prompts of its train and eval splits, estimated from capped draws, with levels flagged
whose eval split holds under 128 distinct prompts or whose whole space is under 1,000 (too
small to show generalisation). The sizes are recorded in the user's cache directory;
``list --json`` shows them as ``prompt_space`` where a check recorded them (no draws in
``list``). Flags do not fail the check: a small level is legal, it just cannot measure much.
"""

from __future__ import annotations

import argparse
import json
import random

from megatron_rl.domains import Domain, load_domains, registry, sizes
from megatron_rl.domains.contract import check_domain
from megatron_rl.domains.jsonl import FAILURES_FILE, export_failures

HELP = "list, show and check task domains; export held-out failures as a task set"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    p = sub.add_parser("list", help="list domains (name, family, tier, difficulty)")
    p.add_argument("patterns", nargs="*", help="names or globs (default: all)")
    p.add_argument("--json", action="store_true", help="one JSON array of domain entries")
    p.add_argument("--task-file", action="append", default=[], help="extra JSONL task set")
    p = sub.add_parser("show", help="sample tasks of one domain with gold and verdict")
    p.add_argument("name")
    p.add_argument("--samples", type=int, default=3, help="tasks to show")
    p.add_argument("--level", type=int, default=None, help="difficulty level (default: easiest)")
    p.add_argument("--split", choices=["train", "eval"], default="train")
    p.add_argument("--task-file", action="append", default=[], help="extra JSONL task set")
    p = sub.add_parser("check", help="run the domain contract")
    p.add_argument("patterns", nargs="*", help="names or globs (default: all)")
    p.add_argument("--samples", type=int, default=2, help="task indices per split and level")
    p.add_argument("--sample-domains", type=int, default=0, help="check K random domains (0: all)")
    p.add_argument("--seed", type=int, default=0, help="task seed and domain sampling seed")
    p.add_argument("--task-file", action="append", default=[], help="extra JSONL task set")
    p.add_argument("--no-sizes", action="store_true", help="skip the prompt-space estimate")
    p.add_argument("--size-draws", type=int, default=2048, help="most draws per level (sizes)")
    p.add_argument(
        "--size-budget", type=float, default=0.25, help="CPU seconds of draws per level (sizes)"
    )
    p = sub.add_parser("export-failures", help=f"RUN_DIR/{FAILURES_FILE} -> JSONL task set")
    p.add_argument("run_dir")
    p.add_argument("--out", default=None, help="output file (default: RUN_DIR/failures.jsonl)")
    p.add_argument("--threshold", type=float, default=1.0, help="scores below this are failures")


def _plugin_errors() -> int:
    """Number of plugin errors (each was already logged to stderr, naming its plugin)."""
    return len(registry().errors)


def _list(args: argparse.Namespace) -> int:
    domains = load_domains(args.patterns or None, task_files=args.task_file)
    entries = [d.describe() for d in domains.values()]
    if args.json:
        recorded = sizes.load_cache()
        for e in entries:
            if e["name"] in recorded:
                e["prompt_space"] = recorded[e["name"]]
        print(json.dumps(entries, indent=1))
        return 0
    for e in entries:
        levels = f"{e['difficulty'][0]}-{e['difficulty'][1]}"
        print(f"{e['name']:40s} {e['family']:13s} {e['tier']:9s} levels {levels}")
    families = sorted({e["family"] for e in entries})
    print(f"{len(entries)} domains in {len(families)} families: {', '.join(families)}")
    return 0


def _show(args: argparse.Namespace) -> int:
    d = load_domains([args.name], task_files=args.task_file)[args.name]
    print(json.dumps(d.describe()))
    for i in range(args.samples):
        task = d.task(args.split, i, args.level, seed=0)
        verdict = d.verify(task, task.gold)
        prompt = task.prompt if len(task.prompt) < 1500 else task.prompt[:1500] + " [...]"
        print(f"\n--- {task.id} (level {task.level})\nPROMPT: {prompt}\nGOLD: {task.gold}")
        print(
            f"VERDICT on gold: score={verdict.score} parsable={verdict.parsable} "
            f"details={json.dumps(verdict.details, default=str)[:300]}"
        )
    return 0


def _check(args: argparse.Namespace) -> int:
    domains = load_domains(args.patterns or None, task_files=args.task_file)
    n_errors = _plugin_errors()
    names = sorted(domains)
    if args.sample_domains and args.sample_domains < len(names):
        names = sorted(random.Random(args.seed).sample(names, args.sample_domains))
    failed, measured = 0, {}
    hung: list[str] = []
    for name in names:
        rep = check_domain(domains[name], samples=args.samples, seed=args.seed)
        status = "ok  " if rep.ok else "FAIL"
        print(
            f"{status} {name:40s} {rep.seconds:6.2f}s  max verify {rep.max_verify_s:.3f}s",
            flush=True,
        )
        for f in rep.failures[:5]:
            print(f"     - {f}")
        failed += not rep.ok
        if not args.no_sizes and rep.ok:
            measured[name] = _sizes(domains[name], args, hung)
    print(
        f"{len(names) - failed}/{len(names)} domains pass the contract; {n_errors} plugin error(s)"
    )
    if measured:
        flagged = sum(bool(s.flags) for levels in measured.values() for s in levels)
        n_levels = sum(len(v) for v in measured.values())
        path = sizes.record(measured, args.seed)
        print(
            f"prompt spaces: {flagged}/{n_levels} levels flagged (eval < "
            f"{sizes.MIN_EVAL_PROMPTS} distinct or space < {sizes.MIN_SPACE}, or too few draws "
            f"to tell); recorded in {path}"
        )
    if hung:
        print(f"generators that hung (a run drawing them would hang too): {', '.join(hung)}")
    return 1 if failed or n_errors else 0


def _sizes(d: Domain, args: argparse.Namespace, hung: list[str]) -> list[sizes.LevelSize]:
    """Estimate and print the prompt space of every level of ``d``; levels whose generator hung
    are appended to ``hung``."""
    out = []
    for level in d.levels:
        try:
            s = sizes.measure_level(d, level, args.seed, args.size_draws, args.size_budget)
        except sizes.GeneratorHang as e:  # a training run that draws this task would hang
            print(f"     level {level}: FLAG hang: the generator {e}", flush=True)
            hung.append(f"{d.name} level {level}")
            continue
        except Exception as e:  # the contract passed, so this is a rare generator failure
            print(f"     level {level}: size estimate failed: {type(e).__name__}: {e}")
            continue
        flags = f"  FLAG {','.join(s.flags)}" if s.flags else ""
        print(
            f"     level {level}: train {s.train.show()}, eval {s.eval.show()}, "
            f"space {s.space.show()} ({s.space.draws} draws, {s.seconds:.2f}s){flags}",
            flush=True,
        )
        out.append(s)
    return out


def _export(args: argparse.Namespace) -> int:
    out = args.out or f"{args.run_dir.rstrip('/')}/failures.jsonl"
    n = export_failures(args.run_dir, out, args.threshold)
    print(f"wrote {n} failing held-out task(s) to {out}")
    return 0


def main(args: argparse.Namespace) -> int:
    actions = {"list": _list, "show": _show, "check": _check, "export-failures": _export}
    return actions[args.action](args)
