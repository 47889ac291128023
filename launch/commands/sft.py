"""``megatron-rl sft CONFIG [key=value ...] [--overwrite]``: supervised fine-tuning (resumes
automatically)."""

from __future__ import annotations

import argparse
import json

HELP = "supervised fine-tuning on prompt/response pairs (loss on responses, packed)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="YAML run config")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. train.lr=1e-4")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="start afresh where the run directory already holds a run, removing its "
        "checkpoints and logs (without it, an existing run is resumed, or refused with "
        "checkpoint.resume=false)",
    )


def main(args: argparse.Namespace) -> int:
    from megatron_rl.config import load_config
    from megatron_rl.train.sft import train_sft

    cfg = load_config(args.config, args.overrides)
    summary = train_sft(cfg, overwrite=args.overwrite)
    print(json.dumps(summary, indent=2))
    return 0
