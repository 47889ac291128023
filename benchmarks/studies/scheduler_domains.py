"""Why these domains: prompt-space size and base-model learnability of the scheduler benchmark.

For every ``tinysched/*`` domain (domains/tiny_sched.py) at its one level:

* **prompt space**: distinct prompts among ``--draws`` training tasks and ``--draws // 3`` eval
  tasks, and an occupancy estimate of each split's size ``S`` from the collisions (the ``S``
  with ``S * (1 - exp(-draws / S)) = distinct``; ``>= draws`` when nothing collided);
* **learnability on the base model**: greedy accuracy, pass@1 and pass@k at T = 1 over ``--n``
  distinct held-out prompts, each once, and the share of k-sample groups with reward variance
  (what GRPO can learn from);
* the class it was put in (frontier / saturated / impossible, ``SPECS``) and whether the
  measurement agrees with it (frontier: pass@k in [0.25, 0.9]; saturated: pass@1 >= 0.8;
  impossible: pass@k <= 0.1).

The GCD and its offset conventions (class ``pair``: the seesaw pair and the dropped GCD + 1) are
measured on the pair's own base model (``--pair-model``, ``models/tiny-seesaw-base``); each row
names the model it was measured on. ``--only`` re-measures some domains and keeps the other rows
of an existing ``--json``.

    .venv/bin/python -m benchmarks.studies.scheduler_domains \
        [--json benchmarks/studies/scheduler_domains.json]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from benchmarks.harness import ROOT, rel

CLASS_RULES = {  # class -> (check on the measurement, the rule in words)
    "frontier": (lambda r, k: 0.25 <= r[f"pass{k}_t1"] <= 0.9, "pass@k in [0.25, 0.9]"),
    "saturated": (lambda r, k: r["pass1_t1"] >= 0.8, "pass@1 >= 0.8"),
    "impossible": (lambda r, k: r[f"pass{k}_t1"] <= 0.1, "pass@k <= 0.1"),
    "pair": (lambda r, k: r["pass1_t1"] >= 0.1, "pass@1 >= 0.1 (reward signal at the start)"),
}


def occupancy_size(draws: int, distinct: int) -> float:
    """The space size S whose expected distinct count after ``draws`` uniform draws is
    ``distinct`` (bisection); inf when every draw was new."""
    if distinct >= draws:
        return math.inf
    lo, hi = float(distinct), float(distinct) * 1e6
    for _ in range(200):
        mid = (lo + hi) / 2
        if mid * (1 - math.exp(-draws / mid)) < distinct:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def prompt_space(domain: Any, draws: int, seed: int) -> dict[str, float]:
    """Distinct prompts among ``draws`` train and ``draws // 3`` eval tasks, and size estimates."""
    out: dict[str, float] = {}
    for split, m in (("train", draws), ("eval", draws // 3)):
        distinct = len({domain.task(split, i, domain.levels[0], seed).prompt for i in range(m)})
        out[f"{split}_draws"] = m
        out[f"{split}_distinct"] = distinct
        out[f"{split}_size_est"] = occupancy_size(m, distinct)
    out["total_size_est"] = out["train_size_est"] + out["eval_size_est"]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(ROOT / "models" / "tiny-base"))
    ap.add_argument("--pair-model", default=str(ROOT / "models" / "tiny-seesaw-base"))
    ap.add_argument("--only", nargs="+", help="measure only these domains (merged into --json)")
    ap.add_argument("--n", type=int, default=160, help="held-out prompts per domain")
    ap.add_argument("--k", type=int, default=8, help="samples per prompt at T=1")
    ap.add_argument("--draws", type=int, default=3000, help="training tasks drawn for the size")
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--json", default=None, help="write the table here")
    a = ap.parse_args(argv)
    import torch

    from benchmarks.studies.tiny_headroom import headroom
    from domains.tiny_sched import OFFSETS, PAIR, SPECS
    from megatron_rl.domains import load_domains
    from megatron_rl.model.tokenizer import load_tokenizer
    from megatron_rl.rollout.build import build_engine
    from megatron_rl.rollout.config import RolloutConfig

    torch.set_num_threads(1)
    classes = {f"tinysched/{n}": spec[2] for n, spec in SPECS.items()}
    classes |= dict.fromkeys([PAIR[0], *OFFSETS], "pair")
    if a.only:
        unknown = sorted(set(a.only) - set(classes))
        if unknown:
            raise SystemExit(f"--only {unknown}: not tinysched domains; allowed: {sorted(classes)}")
        classes = {k: v for k, v in classes.items() if k in a.only}
    old = (
        json.loads(Path(a.json).read_text()) if a.only and a.json and Path(a.json).is_file() else {}
    )
    kept = {k: old.get("settings", {}).get(k) for k in ("n", "k", "draws", "seed")}
    if old and kept != {"n": a.n, "k": a.k, "draws": a.draws, "seed": a.seed}:
        raise SystemExit(f"{a.json} was measured with {kept}; --only needs the same settings")
    rows: dict[str, dict[str, Any]] = dict(old.get("domains", {}))
    by_model: dict[str, list[str]] = {}
    for name, cls in classes.items():
        by_model.setdefault(a.pair_model if cls == "pair" else a.model, []).append(name)
    head = f"{'domain':28s} {'class':10s} {'train':>6s} {'eval':>5s} {'space':>7s} greedy  p@1"
    print(f"{head}  p@{a.k}  mixed  agrees   (n={a.n} held-out prompts, T=1, seed {a.seed})")
    for model, names in by_model.items():
        engine = build_engine(RolloutConfig(engine="hf"), model, a.seed)
        tok = load_tokenizer(model)
        for name, domain in load_domains(names).items():
            r: dict[str, Any] = {"class": classes[name], "model": rel(model)}
            r |= prompt_space(domain, a.draws, a.seed)
            scores = headroom(engine, tok, domain, a.n, a.k, a.seed, domain.levels[0])
            r |= {"prompts": scores.pop("distinct"), **scores}
            check, rule = CLASS_RULES[r["class"]]
            r["rule"], r["agrees"] = rule, bool(check(r, a.k))
            rows[name] = r
            space = r["total_size_est"]
            print(
                f"{name:28s} {r['class']:10s} {r['train_distinct']:6d} {r['eval_distinct']:5d} "
                f"{space if math.isfinite(space) else float('inf'):7.0f} {r['greedy']:6.3f} "
                f"{r['pass1_t1']:5.3f} {r[f'pass{a.k}_t1']:5.3f} {r['mixed_groups']:5.2f}  "
                f"{r['agrees']}",
                flush=True,
            )
        engine.shutdown()
    if a.json:
        meta = {"model": rel(a.model), "pair_model": rel(a.pair_model), "n": a.n, "k": a.k}
        meta |= {"draws": a.draws, "seed": a.seed}
        doc = {"settings": meta, "domains": rows}
        Path(a.json).write_text(json.dumps(doc, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
