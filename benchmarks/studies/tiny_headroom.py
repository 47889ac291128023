"""Headroom of a policy on small domains: greedy accuracy, pass@1 and pass@8 at T=1.

The numbers that decide whether RL on a domain can learn anything: a domain where pass@8 is ~0
gives GRPO no reward variance (no signal); one where greedy is already ~1 has nothing to gain.
Held-out prompts are distinct, each once (``megatron_rl/train/prompt_sets.py``), at each
``--levels`` level (default the easiest); one greedy answer and 8 samples at T=1 per prompt, the
domain's own verifier. (The 2026-11-30 figures in docs/LOG.md drew tasks with repeats.)

    .venv/bin/python -m benchmarks.studies.tiny_headroom --domains 'tiny/*' 'tinymix/*' \
        --all-candidates
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import ROOT


def pick_domains(patterns: list[str], all_candidates: bool) -> dict[str, Any]:
    from domains.tiny_mix import mix_domains
    from megatron_rl.domains import load_domains

    chosen = load_domains(patterns)
    if all_candidates:  # also the tinymix candidates that are not registered
        import fnmatch

        for d in mix_domains(include_all=True):
            if any(fnmatch.fnmatch(d.name, p) for p in patterns):
                chosen.setdefault(d.name, d)
    return dict(sorted(chosen.items()))


def headroom(
    engine: Any, tok: Any, domain: Any, n: int, k: int, seed: int, level: int, split: str = "eval"
) -> dict[str, float]:
    """Greedy accuracy, mean pass@1 at T=1 and pass@k at T=1 over up to ``n`` distinct prompts of
    ``split`` at ``level`` (each once; fewer where the split holds fewer)."""
    from megatron_rl.evaluation.prompt_sets import build_prompt_set
    from megatron_rl.model.tokenizer import prompt_ids
    from megatron_rl.rollout.base import GenRequest, SamplingParams

    tasks = build_prompt_set({domain.name: domain}, n, seed, level, split).tasks[domain.name]
    m = len(tasks)
    greedy = SamplingParams(temperature=0.0, max_tokens=24, n=1, seed=seed)
    sample = SamplingParams(temperature=1.0, max_tokens=24, n=k, seed=seed)
    reqs = [GenRequest(prompt_ids(tok, t.prompt), p) for p in (greedy, sample) for t in tasks]
    outs = engine.generate(reqs)
    g = [domain.verify(t, o[0].text).score for t, o in zip(tasks, outs[:m], strict=True)]
    s = [[domain.verify(t, c.text).score for c in o] for t, o in zip(tasks, outs[m:], strict=True)]
    return {
        "distinct": m,
        "greedy": sum(g) / m,
        "pass1_t1": sum(sum(r) / k for r in s) / m,
        f"pass{k}_t1": sum(max(r) for r in s) / m,
        "mixed_groups": sum(0 < sum(r) < k for r in s) / m,  # groups with reward variance
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(ROOT / "models" / "tiny-base"))
    ap.add_argument("--domains", nargs="+", default=["tiny/*", "tinymix/*"])
    ap.add_argument("--all-candidates", action="store_true", help="unregistered tinymix too")
    ap.add_argument("--n", type=int, default=48, help="distinct held-out prompts per domain")
    ap.add_argument("--levels", type=int, nargs="*", default=None, help="default: the easiest")
    ap.add_argument("--split", choices=["eval", "train"], default="eval")
    ap.add_argument("--k", type=int, default=8, help="samples per task at T=1")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", default=None, help="write the table here")
    a = ap.parse_args(argv)
    import torch

    from megatron_rl.model.tokenizer import load_tokenizer
    from megatron_rl.rollout.build import build_engine
    from megatron_rl.rollout.config import RolloutConfig

    torch.set_num_threads(1)
    engine = build_engine(RolloutConfig(engine="hf"), a.model, a.seed)
    tok = load_tokenizer(a.model)
    rows: dict[str, dict[str, float]] = {}
    print(f"{'domain@level':<36} prompts greedy pass@1 pass@{a.k} mixed  (T=1, seed {a.seed})")
    for name, d in pick_domains(a.domains, a.all_candidates).items():
        for level in a.levels if a.levels is not None else [d.levels[0]]:
            if level not in d.levels:
                continue
            t0 = time.time()
            key = f"{name}@{level}" if len(d.levels) > 1 else name
            rows[key] = r = headroom(engine, tok, d, a.n, a.k, a.seed, level, a.split)
            print(
                f"{key:<36} {r['distinct']:7d} {r['greedy']:6.3f} {r['pass1_t1']:6.3f} "
                f"{r[f'pass{a.k}_t1']:6.3f} {r['mixed_groups']:5.2f}  {time.time() - t0:.1f} s",
                flush=True,
            )
    engine.shutdown()
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
