"""A run that cannot start fails fast, in one line, and leaves its run directory as it was.

Real processes: ``megatron-rl train`` (the CLI) on a micro RL config. The unreachable router is
a loopback port nothing listens on.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.tiny_model import make_tiny_qwen2
from launch.servers import free_port

REPO = Path(__file__).resolve().parents[2]


def _micro(tmp: Path) -> list[str]:
    model = make_tiny_qwen2(tmp / "model", "test", seed=0)
    rows = [{"prompt": f"Say {w}. #{i}", "gold": "a", "verifier": "regex", "pattern": "[\\s\\S]*"}
            for i, w in enumerate(["cats", "dogs", "rain", "sun"] * 4)]  # fmt: skip
    tasks = tmp / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return [
        f"output_dir={tmp / 'runs'}", "run_name=r", f"model.hf_path={model}",
        f"domains.task_files=[{tasks}]", "domains.include=['tasks/*']", "domains.exclude=[]",
        "train.steps=1", "train.threads=1", "rl.prompts_per_step=2", "rl.group_size=2",
        "eval.samples_per_domain=2", "eval.every=0", "rollout.max_new_tokens=4",
        "tracking.wandb=disabled", "tracking.progress=false", "scheduler.oversample=1.0",
        "scheduler.filter_zero_variance=false",
    ]  # fmt: skip


def _train(overrides: list[str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "launch.cli", "train", str(REPO / "configs" / "demo_cpu.yaml")]
    env = {"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    return subprocess.run([*cmd, *overrides], capture_output=True, text=True, timeout=timeout,
                          cwd=REPO, env=env)  # fmt: skip


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _snapshot(root: Path) -> dict[str, tuple[str, int]]:
    """Every file under ``root``: content hash and modification time (ns)."""
    return {
        str(p.relative_to(root)): (hashlib.sha1(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_unreachable_rollout_url_fails_in_one_line_and_touches_no_run_dir(tmp_path: Path) -> None:
    base = _micro(tmp_path)
    done = _train(base)  # a finished run: summary, checkpoints, config, metrics
    assert done.returncode == 0, done.stderr[-3000:]
    run_dir = tmp_path / "runs" / "r"
    assert (run_dir / "summary.json").is_file()
    before = _snapshot(run_dir)
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    bad = [*base, "rollout.engine=sglang", f"rollout.urls=[{dead}]"]
    for overrides in (bad, [*bad, "run_name=fresh"]):  # the finished run, and a new one
        t0, cpu0 = time.monotonic(), _children_cpu_s()
        out = _train(overrides, timeout=90)
        took, cpu = time.monotonic() - t0, _children_cpu_s() - cpu0
        assert out.returncode == 2, out.stderr[-3000:]
        if os.getloadavg()[0] < 4 * (os.cpu_count() or 1):
            assert took < 15, took  # wall time: the acceptance bound (CI's idle machine)
        else:  # a machine this overloaded stretches any wall time: no torch/megatron was loaded
            assert cpu < 5, (cpu, took, os.getloadavg())
        lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1, out.stderr  # one line, and no "Unclosed client session"
        assert f"rollout.urls[0]={dead} is unreachable" in lines[0]
    assert _snapshot(run_dir) == before  # byte for byte, times included
    assert not (tmp_path / "runs" / "fresh").exists()
