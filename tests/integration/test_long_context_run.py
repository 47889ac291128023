"""`megatron-rl train configs/long_context_cpu.yaml` learns from reward under CP=2 (issue 27).

Two CPU processes (gloo) under torchrun run the shipped long-context config for one step from the
shipped warm start (models/tiny-long-sft) on the retrieval family's ``digit_needle`` at the
curriculum's top level (4096 tokens, where the warm start is right about half the time, so
nearly every group's rewards vary): generation and scoring on the controller, then a GRPO step
whose 4k-token sequences are split over both CP ranks (the config's switch point,
``parallel.cp_min_tokens=4096``). The reward must be nonzero and the gradient
must come from it alone: the config has no entropy bonus (issue 17's run needed one).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from launching import torchrun

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_long_context_config_learns_from_reward_with_cp2(tmp_path: Path) -> None:
    overrides = ["train.steps=1", "rl.prompts_per_step=4", "eval.levels=[]",
                 "eval.samples_per_domain=2", "scheduler.curriculum_start_level=4",
                 f"output_dir={tmp_path}",
                 "tracking.progress=false"]  # fmt: skip
    torchrun(2, ["-m", "launch.cli", "train", "configs/long_context_cpu.yaml", *overrides],
             timeout=900)  # fmt: skip
    run = tmp_path / "long_context_cpu"
    resolved = yaml.safe_load((run / "config.yaml").read_text())
    assert resolved["rl"]["entropy_coef"] == 0.0 and resolved["parallel"]["cp"] == 2
    assert resolved["parallel"]["cp_min_tokens"] == 4096
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    (m,) = [r for r in rows if "train/response_tokens" in r]
    assert m["sched/long_context/digit_needle/level"] == 4.0
    assert 4096 < m["rollout/prompt_tokens"] / m["rollout/samples"] < 4110  # 4096 + template
    assert 0.0 < m["rollout/reward_mean"] < 1.0  # the warm start solves some 4k-token prompts
    assert m["train/response_tokens"] > 0 and m["train/skipped_steps"] == 0.0
    assert m["train/grad_norm"] > 0  # from the reward alone (no entropy term)
    assert (run / "summary.json").exists()
