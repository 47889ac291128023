"""``megatron-rl train CONFIG [key=value ...]``: the RL loop (resumes automatically)."""

from __future__ import annotations

import argparse

HELP = "RL training (GRPO family) from verifiable rewards; re-run the same command to resume"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="YAML run config")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. rl.group_size=8")


def main(args: argparse.Namespace) -> int:
    from megatron_rl.config import load_config
    from megatron_rl.train.preflight import check_rollout_reachable

    cfg = load_config(args.config, args.overrides)
    check_rollout_reachable(cfg)  # before torch and megatron load: fails in seconds, not minutes
    from megatron_rl.rollout.base import EngineStartError
    from megatron_rl.train.rl import train_rl

    try:
        summary = train_rl(cfg)
    except EngineStartError as e:
        raise ValueError(f"rollout engine {cfg.rollout.engine!r} failed to start: {e}") from None
    return 0 if summary.get("completed", True) else 1
