"""The tables ``make bench`` generates from ``benchmarks/results.json`` (``run_all.py`` writes
them): the full one (``results.md`` and ``benchmarks/README.md``) and the headline one of
docs/results.md. Pure functions of the results; nothing here runs or writes."""

from __future__ import annotations

from typing import Any


def flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dict -> {"a.b.c": leaf}; lists and strings are kept as leaves."""
    if not isinstance(d, dict):
        return {prefix: d}
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1e4 else f"{v:.0f}"
    return str(v)


def markdown(results: dict[str, Any]) -> str:
    """The results table: one row per headline number (``raw`` details stay in the JSON)."""
    meta = results.get("meta", {})
    partial = (f" for {', '.join(meta['only'])}; the other rows {meta.get('others_from', '?')} "
               "(each row's `ran` says when)") if meta.get("only") else ""  # fmt: skip
    lines = [
        f"Measured {meta.get('date', '?')} on {meta.get('cores', '?')} cores "
        f"(load average {fmt(meta.get('load_avg_1m', '?'))} at start){partial}. "
        "CPU figures: read the ratios, not the absolute times.",
        "",
        "| benchmark | metric | value |",
        "|---|---|---|",
    ]
    for name in sorted(k for k in results if k != "meta"):
        entry = results[name]
        shown = {k: v for k, v in entry.items() if k not in ("raw", "wall_s")}
        for key, val in flatten(shown).items():
            if isinstance(val, list):
                continue
            lines.append(f"| {name} | {key} | {fmt(val)} |")
    return "\n".join(lines) + "\n"


def _get(results: dict[str, Any], path: str) -> Any:
    node: Any = results
    for part in path.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


HEADLINES = [  # (label, key in results.json) for the top-level README's table
    ("RL vs TRL, tiny: step time megatron-rl / TRL", "rl_vs_trl.tiny.step_time_ratio"),
    ("RL vs TRL, tiny: CPU seconds per step megatron-rl / TRL", "rl_vs_trl.tiny.step_cpu_ratio"),
    (
        "RL vs TRL, tiny: step time, one-step off-policy megatron-rl / synchronous TRL",
        "rl_vs_trl.tiny.overlapped.step_time_ratio",
    ),
    (
        "RL vs TRL, tiny: time to +10 held-out points, megatron-rl / TRL, like for like",
        "rl_vs_trl_gain.text",
    ),
    (
        "RL vs TRL, tiny: time to +10 held-out points, megatron-rl demo recipe / TRL (not like "
        "for like: 2x generation, both cores)",
        "rl_vs_trl_gain.demo_text",
    ),
    ("RL vs TRL, tiny: held-out accuracy, megatron-rl", "rl_vs_trl.tiny.accuracy.megatron_rl"),
    ("RL vs TRL, tiny: held-out accuracy, TRL", "rl_vs_trl.tiny.accuracy.trl"),
    ("RL vs TRL, ~20M: step time megatron-rl / TRL", "rl_vs_trl.m20.step_time_ratio"),
    ("RL vs TRL, ~20M: CPU seconds per step megatron-rl / TRL", "rl_vs_trl.m20.step_cpu_ratio"),
    (
        "RL vs TRL, ~20M: step time, one-step off-policy megatron-rl / synchronous TRL",
        "rl_vs_trl.m20.overlapped.step_time_ratio",
    ),
    (
        "RL vs TRL, ~20M: trained tokens/s, megatron-rl",
        "rl_vs_trl.m20.trained_tokens_per_s.megatron_rl",
    ),
    ("RL vs TRL, ~20M: trained tokens/s, TRL", "rl_vs_trl.m20.trained_tokens_per_s.trl"),
    (
        "RL vs TRL, ~20M: response tokens trained/s, megatron-rl",
        "rl_vs_trl.m20.response_tokens_per_s.megatron_rl",
    ),
    ("RL vs TRL, ~20M: response tokens trained/s, TRL", "rl_vs_trl.m20.response_tokens_per_s.trl"),
    ("rollout 100M: hf engine / transformers generate", "rollout.ratio_vs_transformers.100m/hf"),
    ("rollout 100M: vLLM CPU / transformers generate", "rollout.ratio_vs_transformers.100m/vllm"),
    ("training step MFU, tiny model", "train.mfu.tiny"),
    ("training step MFU, ~100M model", "train.mfu.100m"),
    ("weight sync seconds (disk, the default), ~100M model", "weight_sync.seconds.100m"),
    ("weight sync share of a demo step", "weight_sync.demo_step_fraction"),
    ("demo step share: generate", "time_split.share.generate"),
    ("demo step share: train", "time_split.share.train"),
]


def headline(results: dict[str, Any]) -> str:
    """The short table the top-level README carries (the full one is in results.md)."""
    meta = results.get("meta", {})
    source = (f"From `make bench` ({meta.get('date', '?')}, {meta.get('cores', '?')} cores, "
              f"{fmt(meta.get('total_s', '?'))} s for all CPU benchmarks)")  # fmt: skip
    if meta.get("only"):  # a partial re-run merged into an earlier full one
        only, others = ",".join(meta["only"]), meta.get("others_from", "?")
        source = (f"From `run_all.py --only {only}` ({meta.get('date', '?')}, "
                  f"{meta.get('cores', '?')} cores, load average "
                  f"{fmt(meta.get('load_avg_1m', '?'))} at start, "
                  f"{fmt(meta.get('total_s', '?'))} s), merged "
                  f"into `make bench` of {others} for the other rows")  # fmt: skip
    lines = [f"{source}; full table: benchmarks/results.md.",
             "", "| benchmark | value |", "|---|---|"]  # fmt: skip
    for label, key in HEADLINES:
        val = _get(results, key)
        if val is not None:
            lines.append(f"| {label} | {fmt(val)} |")
    return "\n".join(lines) + "\n"
