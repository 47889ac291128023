"""``megatron-rl sft CONFIG [key=value ...] [--overwrite]``: supervised fine-tuning (resumes
automatically)."""

from __future__ import annotations

import argparse
import json

from launch.commands.train import add_run_arguments

HELP = "supervised fine-tuning on prompt/response pairs (loss on responses, packed)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_run_arguments(p, "train.lr=1e-4")


def main(args: argparse.Namespace) -> int:
    from megatron_rl.config import load_config
    from megatron_rl.train.sft import train_sft

    cfg = load_config(args.config, args.overrides)
    summary = train_sft(cfg, overwrite=args.overwrite)
    print(json.dumps(summary, indent=2))
    return 0
