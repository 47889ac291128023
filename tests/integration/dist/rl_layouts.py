"""RL runs under several layouts in one launch, recording what each rank saw.

    torchrun --nproc_per_node N tests/integration/dist/rl_layouts.py --out-dir DIR --base BASE.json \
        --groups GDIR --mode record|replay RUN[,RUN...]

``BASE.json`` holds the config path and the dotted overrides every run shares; a RUN is
``name[/source][:override;override]`` (e.g. ``tp2/dp1:parallel.tp=2``), with the run directory
``<output_dir>/<name>``. The runs go one after the other in the same processes (Megatron's groups
are rebuilt between them, the gloo world is kept). A RUN whose name starts with ``thin`` keeps only
the first selected group each step, so a 2-rank run has fewer groups than DP ranks.

Recording, per run and rank, in ``DIR/<name>.rank<R>.json``: the layout coordinates, how many
rollout engines this rank built and how many ``generate`` calls it made, and per step the hash of
the micro-batches it trained on, its samples (each one's tokens, whether packed whole or after a
shared prompt), the tokens it packed and the per-DP-rank token counts shipped by the controller. ``record`` saves every ``generate`` call's completions (rank 0, where the one engine
lives) to ``GDIR/<name>.pkl``; ``replay`` serves ``GDIR/<source>.pkl`` back in the same order
(asserting the same prompts), so runs of different layouts train on exactly the same groups and
only the layout differs.
"""

from __future__ import annotations

import argparse
import json
import pickle
from pathlib import Path
from typing import Any

import torch

from megatron_rl.packing.batch import sample_rows
from megatron_rl.config import load_config
from megatron_rl.model.parallel import destroy_distributed
from megatron_rl.rollout.hf_engine import HFEngine
from megatron_rl.scheduler import DomainScheduler
from megatron_rl.train import rl
from megatron_rl.train.data_plane import batch_hash

STATE: dict[str, Any] = {}


def patch() -> None:
    real_init, real_generate, real_ship = HFEngine.__init__, HFEngine.generate, rl.ship

    def init(self: HFEngine, *a: Any, **k: Any) -> None:
        STATE["engines"] += 1
        real_init(self, *a, **k)

    def generate(self: HFEngine, requests: list[Any]) -> list[Any]:
        i = STATE["calls"]
        STATE["calls"] += 1
        prompts = [(r.prompt_ids, r.params.n) for r in requests]
        if STATE["replay"] is not None:
            calls = STATE["replay"]
            assert calls[i][0] == prompts, f"generate call {i}: other prompts than recorded"
            return calls[i][1]
        out = real_generate(self, requests)
        STATE["recorded"].append((prompts, out))
        Path(STATE["record"]).write_bytes(pickle.dumps(STATE["recorded"]))
        return out

    def ship(*a: Any, **k: Any) -> Any:
        work = real_ship(*a, **k)
        STATE["info"] = a[2]
        STATE["steps"].append(
            {
                "hash": batch_hash(work.batches),
                "seqs": [b.tokens[rows].tolist() for b in work.batches
                         for rows in sample_rows(b).values()],  # each sample's whole tokens
                "packed": sum(b.num_tokens for b in work.batches if b.seq_ids),
                "zero_batches": sum(not b.seq_ids for b in work.batches),
                "tokens": work.info.get("tokens"),
                "train": work.train,
            }
        )  # fmt: skip
        return work

    HFEngine.__init__ = init  # type: ignore[method-assign]
    HFEngine.generate = generate  # type: ignore[method-assign]
    rl.ship = ship  # type: ignore[assignment]


def thin(on: bool) -> None:
    """Keep only the first selected group of every step (fewer groups than DP ranks)."""
    real = STATE.setdefault("select", DomainScheduler.select)
    if on:
        DomainScheduler.select = lambda self, *a, **k: real(self, *a, **k)[:1]  # type: ignore
    else:
        DomainScheduler.select = real  # type: ignore[method-assign]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out-dir", required=True)
    parser.add_argument("--base", required=True)
    parser.add_argument("--groups", required=True)
    parser.add_argument("--mode", choices=["record", "replay"], required=True)
    parser.add_argument("runs")
    args = parser.parse_args()
    torch.set_num_threads(1)
    base = json.loads(Path(args.base).read_text())
    patch()
    groups = Path(args.groups)
    for run in args.runs.split(","):
        spec, _, extra = run.partition(":")
        name, _, source = spec.partition("/")
        replay = (
            pickle.loads((groups / f"{source}.pkl").read_bytes()) if args.mode == "replay" else None
        )
        STATE.update(engines=0, calls=0, steps=[], recorded=[], replay=replay)
        STATE["record"] = groups / f"{name}.pkl"
        thin(name.startswith("thin"))
        overrides = [*base["overrides"], f"run_name={name}", *filter(None, extra.split(";"))]
        rl.train_rl(load_config(base["config"], overrides))
        d = STATE["info"]
        rec = {
            k: getattr(d, k) for k in ("rank", "dp_rank", "tp_rank", "pp_rank", "dp", "tp", "pp")
        }
        rec.update(engines=STATE["engines"], generate_calls=STATE["calls"], steps=STATE["steps"])
        (Path(args.out_dir) / f"{name}.rank{d.rank}.json").write_text(json.dumps(rec))
        destroy_distributed(keep_process_group=True)
    destroy_distributed()


if __name__ == "__main__":
    main()
