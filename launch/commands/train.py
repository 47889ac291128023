"""``megatron-rl train CONFIG [key=value ...] [--overwrite]``: the RL loop (resumes automatically;
``--overwrite`` starts afresh over a run already in the run directory)."""

from __future__ import annotations

import argparse

HELP = "RL training (GRPO family) from verifiable rewards; re-run the same command to resume"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_run_arguments(p, "rl.group_size=8")


def add_run_arguments(p: argparse.ArgumentParser, example: str) -> None:
    """CONFIG, its dotted overrides and --overwrite: what `train` and `sft` both take."""
    p.add_argument("config", help="YAML run config")
    p.add_argument("overrides", nargs="*", help=f"dotted overrides, e.g. {example}")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="start afresh where the run directory already holds a run, removing its "
        "checkpoints and logs (without it, an existing run is resumed, or refused with "
        "checkpoint.resume=false)",
    )


def main(args: argparse.Namespace) -> int:
    from megatron_rl.config import load_config
    from megatron_rl.train.preflight import check_rollout_reachable

    cfg = load_config(args.config, args.overrides)
    check_rollout_reachable(cfg)  # before torch and megatron load: fails in seconds, not minutes
    from megatron_rl.rollout.base import EngineStartError
    from megatron_rl.train.rl import train_rl

    try:
        summary = train_rl(cfg, overwrite=args.overwrite)
    except EngineStartError as e:
        raise ValueError(f"rollout engine {cfg.rollout.engine!r} failed to start: {e}") from None
    return 0 if summary.get("completed", True) else 1
