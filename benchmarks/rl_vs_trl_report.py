"""Printing for ``rl_vs_trl.py``: one table per size."""

from __future__ import annotations

from typing import Any

from benchmarks.harness import PHASES

KEYS = ("step_s", "step_cpu_s", "trained_tokens_per_s", "response_tokens_per_s",
        "tokens_per_step_s")  # fmt: skip


def print_size(size: str, res: dict[str, Any]) -> None:
    """Per-phase seconds side by side (the median round), ratios over every round."""
    s = res["setup"]
    print(
        f"\n[{size}] GRPO {s['steps']} steps x {s['prompts']} prompts x n={s['group']} x <= "
        f"{s['max_tokens']} tokens, {s['model']}, threads={s['threads']}, "
        f"load avg {s['load_avg_1m']:.1f} -> {s['load_avg_1m_end']:.1f}"
    )
    over = res["overlapped"]
    print(f"{'seconds per step':<26}{'megatron-rl':>12}{'TRL':>12}{'overlapped':>12}")
    for p in PHASES:
        m, t = res["phases"][p]["megatron_rl"], res["phases"][p]["trl"]
        print(f"  {p:<24}{m:>12.3f}{t:>12.3f}{over['phases'][p]:>12.3f}")
    for key in KEYS:
        m, t = res[key]["megatron_rl"], res[key]["trl"]
        print(f"{key:<26}{m:>12.3f}{t:>12.3f}")
    pad = res["padded_token_frac"]["trl"]
    print(f"{'padded token share':<26}{0.0:>12.3f}{pad:>12.3f}")
    acc = res["accuracy"]
    domains = ", ".join(res["shared_domains"])
    print(f"{'held-out accuracy':<26}{acc['megatron_rl']:>12.3f}{acc['trl']:>12.3f}"
          f"{over['accuracy']:>12.3f}   (before {res['accuracy_before']:.3f}; "
          f"domains {domains})")  # fmt: skip
    reps = ", ".join(f"{r:.3f}" for r in res["step_time_ratio_repeats"])
    print(f"step time ratio megatron-rl / TRL (synchronous) = {res['step_time_ratio']:.3f}, "
          f"median of [{reps}] (CPU seconds per step: {res['step_cpu_ratio']:.3f}); "
          f"LR schedules differ by at most {res['lr_max_rel_diff']:.1e} (relative)")  # fmt: skip
    reps = ", ".join(f"{r:.3f}" for r in over["step_time_ratio_repeats"])
    print(f"overlapped, one-step off-policy megatron-rl / synchronous TRL = "
          f"{over['step_time_ratio']:.3f}, median of [{reps}]")  # fmt: skip
