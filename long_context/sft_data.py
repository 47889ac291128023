"""SFT pairs for the long-context warm start: short retrieval documents, written as JSONL.

``make long-context-base`` runs this, then ``megatron-rl sft configs/long_sft.yaml`` on the file.
The documents are the retrieval family's (``long_context/retrieval.py``) at lengths drawn
uniformly from ``--chars LO HI`` (lengths too short for a kind's records are drawn again; the
range sits below the RL curriculum's first level: the warm start
teaches the answer format and the lookup on short contexts; RL extends it to long ones). Only
training-split prompts are written (``split_of`` on the domain's prompt hash), so no held-out
prompt of any level can appear in SFT, whatever its length.

    python -m long_context.sft_data OUT.jsonl --n 60000 --chars 160 512 --seed 11
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from long_context.retrieval import GENERATORS
from megatron_rl.domains.base import split_of


def write_pairs(
    out: Path, n: int, lo: int, hi: int, seed: int, kinds: list[str] | None = None
) -> int:
    """Write ``n`` training-split {prompt, response} lines to ``out``; returns lines written."""
    kinds = kinds or sorted(GENERATORS)
    unknown = sorted(set(kinds) - set(GENERATORS))
    if unknown:
        raise ValueError(f"--kinds: unknown kind {unknown[0]!r}; choose from {sorted(GENERATORS)}")
    if not 0 < lo <= hi:
        raise ValueError(f"--chars must be 0 < LO <= HI, got {lo} {hi}")
    rng = random.Random(seed)
    out.parent.mkdir(parents=True, exist_ok=True)
    written = 0
    with out.open("w") as f:
        while written < n:
            kind = kinds[written % len(kinds)]
            try:
                task = GENERATORS[kind](rng, rng.randint(lo, hi))
            except ValueError:  # too short for this kind's records: draw another length
                continue
            if split_of(task.prompt) != "train":
                continue
            f.write(json.dumps({"prompt": task.prompt, "response": task.gold, "kind": kind}) + "\n")
            written += 1
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--n", type=int, default=60000)
    parser.add_argument("--chars", type=int, nargs=2, default=(160, 512), metavar=("LO", "HI"))
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--kinds", nargs="*", default=None)
    args = parser.parse_args()
    n = write_pairs(args.out, args.n, args.chars[0], args.chars[1], args.seed, args.kinds)
    print(f"{args.out}: {n} SFT pairs, {args.chars[0]}-{args.chars[1]} characters")


if __name__ == "__main__":
    main()
