"""SFT pairs for the long-context warm start: short retrieval documents, written as JSONL.

``make long-context-base`` runs this, then ``megatron-rl sft configs/long_sft.yaml`` on the file.
The documents are the retrieval family's (``long_context/retrieval.py``) at lengths drawn
uniformly from ``[LO, top]``, where ``top`` grows linearly from ``LO`` to ``HI`` over the first
half of the file and stays at ``HI`` after (a length too short for a kind's records is raised
until they fit), and with one record per document at first, then decoys added one at a time
(:data:`RECORD_SCHEDULE`; ``multi_needle`` always has the two it asks for). With
``sft.shuffle: false`` the file order is the curriculum. The lengths sit below the RL
curriculum's first level: the warm start teaches the answer format and the lookup on short
contexts, RL extends it to long ones. Only training-split prompts are written (``split_of`` on
the domain's prompt hash), so no held-out prompt of any level can appear in SFT.

    python -m long_context.sft_data OUT.jsonl --n 60000 --chars 180 400 --seed 11
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from long_context.retrieval import GENERATORS, N_RECORDS, RetrievalTask
from megatron_rl.domains.base import split_of

# (up to this fraction of the file, records per document): one record first (the answer is the
# only code or named line: the model learns to find and copy it), then decoys one at a time, and
# the domains' N_RECORDS for the second half
RECORD_SCHEDULE = ((0.1, 1), (0.25, 2), (0.4, 3), (1.01, N_RECORDS))


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
            # lengths grow through the file from lo towards hi (a length curriculum when the SFT
            # keeps the file's order, sft.shuffle: false): line k draws from [lo, lo + span]
            top = lo + round((hi - lo) * min(1.0, 2.0 * (written + 1) / n))
            records = 1 if kind == "digit_needle" else records_at(written / n)  # no decoys there
            task = _task(rng, kind, rng.randint(lo, top), hi, records)
            if split_of(task.prompt) != "train":
                continue
            f.write(json.dumps({"prompt": task.prompt, "response": task.gold, "kind": kind}) + "\n")
            written += 1
    return written


def records_at(position: float) -> int:
    """Records per document at a relative position in the file (decoys arrive one by one)."""
    return next(n for limit, n in RECORD_SCHEDULE if position < limit)


def _task(rng: random.Random, kind: str, chars: int, hi: int, records: int) -> RetrievalTask:
    """A ``kind`` task of ``chars`` characters, or the shortest longer one its records fit in."""
    while True:
        try:
            return GENERATORS[kind](rng, chars, records)
        except ValueError:
            if chars >= hi:
                raise ValueError(f"--chars: {hi} characters cannot hold a {kind} task") from None
            chars = min(hi, chars + 16)


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
