"""configs/many_domains_cpu.yaml as users start it (issue 40): every one of its domains admitted
and pre-screened, two steps, a held-out sweep at each, the per-domain heatmap and the per-family
radar written to the run directory and logged to W&B (offline mode, the real client). Sweeps are
cut to 2 prompts of 1 sample per domain so that the whole config runs in about a minute."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "many_domains_cpu.yaml"


def test_the_shipped_config_trains_hundreds_of_domains_and_draws_them(tmp_path) -> None:
    cmd = [sys.executable, "-m", "launch.cli", "train", str(CONFIG), f"output_dir={tmp_path}"]
    cmd += [
        "run_name=m",
        "train.steps=2",
        "eval.every=1",
        "eval.samples_per_domain=2",
        "eval.samples_per_prompt=1",
        "checkpoint.every=0",
        "tracking.wandb=offline",
        "tracking.progress=false",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_SILENT": "true"}
    env.pop("WANDB_API_KEY", None)
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout + proc.stderr
    admitted = int(out.split("domains: ")[-1].split(" admitted")[0])
    assert admitted >= 200, out[-2000:]  # the floor; the config lists 332
    run = tmp_path / "m"
    for png in ("eval_heatmap.png", "radar.png"):
        assert (run / png).stat().st_size > 10_000, png
    media = {
        p.name.split("_")[0] for p in run.glob("wandb/offline-run-*/files/media/images/eval/*")
    }
    assert {"heatmap", "radar"} <= media, media
    cfg = yaml.safe_load(CONFIG.read_text())
    assert cfg["rl"]["prompts_per_step"] == 32 and cfg["scheduler"]["oversample"] == 1.0
    # the study's best arm: the pre-screen and the adaptive mix over the kept domains, charged
    # to the 600 steps of generation it was run at
    assert cfg["scheduler"]["policy"] == "learnability" and cfg["scheduler"]["learn_ucb"] == 0.05
    screen = json.loads((run / "prescreen.json").read_text())
    assert screen["groups"] == 2 * admitted and 0 < len(screen["kept"]) < admitted
    assert cfg["train"]["steps"] == 600 - -(-screen["groups"] // 32)
