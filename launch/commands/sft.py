"""``megatron-rl sft CONFIG [key=value ...]``: supervised fine-tuning (resumes automatically)."""

from __future__ import annotations

import argparse
import json

HELP = "supervised fine-tuning on prompt/response pairs (loss on responses, packed)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="YAML run config")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. train.lr=1e-4")


def main(args: argparse.Namespace) -> int:
    from megatron_rl.config import load_config
    from megatron_rl.train.sft import train_sft

    cfg = load_config(args.config, args.overrides)
    summary = train_sft(cfg)
    print(json.dumps(summary, indent=2))
    return 0
