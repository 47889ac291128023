"""The many-domain study's screen: every domain of the study on the base model, then its class.

The study's domains are those of ``configs/many_domains_cpu.yaml``: every ``ladder/*`` rung
(domains/ladders.py) and the reasoning-gym family where it fits the tiny model. For each,
``--n`` distinct prompts of the **training** split (the
held-out prompts the study scores are never looked at here) get ``--k`` samples at T = 1 and one
greedy answer; the domain is registered as

* ``out_of_reach``: pass@k = 0 (no prompt solved once in k samples);
* ``saturated``: pass@1 >= 0.9;
* ``frontier``: everything else.

The study's primary metric averages the frontier domains and, in each ladder, the first
out-of-reach rung above its hardest frontier rung (``next``: where a moving frontier shows), see
:func:`primary_set`. The classes are registered in ``many_domains_screen.json`` before any report
run (docs/scheduler.md, "Hundreds of domains"); re-screening writes a new file, never this one.

    .venv/bin/python -m benchmarks.studies.many_screen \
        [--json benchmarks/studies/many_domains_screen.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import ROOT, rel

SCREEN = ROOT / "benchmarks" / "studies" / "many_domains_screen.json"
CONFIG = ROOT / "configs" / "many_domains_cpu.yaml"


def study_domains(config: Path = CONFIG) -> list[str]:
    """The study's domain names: the config's include patterns, resolved in the registry."""
    from megatron_rl.config import load_config
    from megatron_rl.domains import load_domains

    cfg = load_config(config, [])
    return sorted(load_domains(cfg.domains.include, cfg.domains.exclude))


def family_of(name: str) -> str:
    """A domain's family in the study's tables and pictures: its ladder, or ``rg/<generator>``."""
    from domains.ladders import ladder_of

    if name.startswith("ladder/"):
        return ladder_of(name)
    return name.split("@", 1)[0]


def classify(pass1: float, passk: float) -> str:
    if passk == 0.0:
        return "out_of_reach"
    return "saturated" if pass1 >= 0.9 else "frontier"


def primary_set(classes: dict[str, str]) -> list[str]:
    """Frontier domains, plus per ladder the first out-of-reach rung above its hardest frontier
    rung (rungs are ordered easiest first in domains/ladders.py)."""
    from domains.ladders import LADDERS

    out = [n for n, c in classes.items() if c == "frontier" and not n.startswith("ladder/")]
    for ladder, (_, _, rungs) in LADDERS.items():
        names = [f"ladder/{ladder}_{r}" for r, _ in rungs]
        names = [n for n in names if n in classes]
        front = [i for i, n in enumerate(names) if classes[n] == "frontier"]
        out += [names[i] for i in front]
        if front:
            above = [n for n in names[front[-1] + 1 :] if classes[n] == "out_of_reach"]
            out += above[:1]
    return sorted(out)


def load_screen(path: Path = SCREEN) -> dict[str, Any]:
    doc = json.loads(path.read_text())
    classes = {k: v["class"] for k, v in doc["domains"].items()}
    if sorted(doc["primary"]) != primary_set(classes):
        raise ValueError(f"{path}: its primary set disagrees with its classes")
    return doc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(ROOT / "models" / "tiny-demo-base"))
    ap.add_argument("--domains", nargs="+", default=None, help="default: the study's")
    ap.add_argument("--n", type=int, default=64, help="distinct training prompts per rung")
    ap.add_argument("--k", type=int, default=16, help="samples per prompt at T = 1")
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--json", default=None, help="write the screen here")
    a = ap.parse_args(argv)
    if a.json and Path(a.json).resolve() == SCREEN.resolve() and SCREEN.exists():
        raise SystemExit(f"{rel(SCREEN)} is registered; write a re-screen to another file")
    import torch

    from benchmarks.studies.tiny_headroom import headroom
    from megatron_rl.domains import load_domains
    from megatron_rl.model.tokenizer import load_tokenizer
    from megatron_rl.rollout.build import build_engine
    from megatron_rl.rollout.config import RolloutConfig

    torch.set_num_threads(1)
    engine = build_engine(RolloutConfig(engine="hf"), a.model, a.seed)
    tok = load_tokenizer(a.model)
    rows: dict[str, dict[str, Any]] = {}
    t0 = time.time()
    chosen = load_domains(a.domains or study_domains())
    print(f"{'domain':44s} prompts greedy  p@1  p@{a.k}  mixed  class   (train split, T=1)")
    for i, (name, d) in enumerate(sorted(chosen.items())):
        r = headroom(engine, tok, d, a.n, a.k, a.seed, d.levels[0], "train")
        r["class"] = classify(r["pass1_t1"], r[f"pass{a.k}_t1"])
        rows[name] = r
        print(
            f"{name:44s} {r['distinct']:7d} {r['greedy']:6.3f} {r['pass1_t1']:5.3f} "
            f"{r[f'pass{a.k}_t1']:5.3f} {r['mixed_groups']:5.2f}  {r['class']}  "
            f"[{i + 1}/{len(chosen)}, {time.time() - t0:.0f} s]",
            flush=True,
        )
    engine.shutdown()
    classes = {k: v["class"] for k, v in rows.items()}
    counts = {c: sum(v == c for v in classes.values()) for c in sorted(set(classes.values()))}
    primary = primary_set(classes)
    print(f"classes {counts}; primary set {len(primary)} rungs; {time.time() - t0:.0f} s")
    if a.json:
        meta = {"model": rel(a.model), "n": a.n, "k": a.k, "seed": a.seed, "split": "train"}
        doc = {"settings": meta, "counts": counts, "primary": primary, "domains": rows}
        doc["seconds"] = round(time.time() - t0, 1)
        Path(a.json).write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
