"""A step longer than torchrun's shutdown timeout still leaves a checkpoint behind.

On Slurm, USR1 reaches torchrun, which forwards it to the ranks and SIGKILLs them
``--shutdown-timeout`` seconds later; the ranks checkpoint at the end of the current step, so a
step longer than that timeout was killed before it saved. The trainer now knows the grace
period (``checkpoint.preempt_grace_s``, which the rendered script sets to torchrun's timeout)
and checkpoints every step while steps outlast it.

Real processes: `megatron-rl train` under torchrun (2 gloo ranks). The ranks are frozen
(SIGSTOP) while USR1 is sent, so the kill lands in the middle of a step whatever its length.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from test_slurm import _trainer_pids

from benchmarks.tiny_model import make_tiny_qwen2

REPO = Path(__file__).resolve().parents[2]
GRACE_S = 1  # torchrun --shutdown-timeout, and what the trainer is told


def _rows(run_dir: Path) -> list[dict]:
    f = run_dir / "metrics.jsonl"
    rows = [json.loads(line) for line in f.read_text().splitlines()] if f.exists() else []
    return [r for r in rows if "rollout/samples" in r]


def test_a_step_longer_than_the_shutdown_timeout_still_leaves_a_checkpoint(tmp_path: Path) -> None:
    model = make_tiny_qwen2(tmp_path / "model", "3m", seed=0)
    words = ["cats", "dogs", "rain", "sun", "tea", "maps", "jazz", "snow"] * 2
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"prompt": f"Say {w}. #{i}", "gold": "a",
                     "verifier": "regex", "pattern": "[\\s\\S]*"}) + "\n"
                     for i, w in enumerate(words)))  # fmt: skip
    run_dir = tmp_path / "runs" / "job"
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        "--signals-to-handle", "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1",
        "--shutdown-timeout", str(GRACE_S),
        "-m", "launch.cli", "train", str(REPO / "configs" / "demo_cpu.yaml"),
        f"output_dir={tmp_path / 'runs'}", "run_name=job", f"model.hf_path={model}",
        f"domains.task_files=[{tasks}]", "domains.include=['tasks/*']", "domains.exclude=[]",
        "train.steps=60", "train.threads=1", "rl.prompts_per_step=4", "rl.group_size=8",
        "eval.samples_per_domain=4", "eval.every=0", "rollout.max_new_tokens=128",
        "tracking.wandb=disabled", "tracking.progress=false", "scheduler.oversample=1.0",
        "scheduler.filter_zero_variance=false", "checkpoint.every=0",  # only the last, before
        f"checkpoint.preempt_grace_s={GRACE_S}",
    ]  # fmt: skip
    env = {"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    env |= {k: v for k, v in os.environ.items() if k == "PYTHONPATH"}
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 400
        while len(_rows(run_dir)) < 3:
            assert proc.poll() is None, proc.communicate()[0][-4000:]
            assert time.monotonic() < deadline, "no training rows"
            time.sleep(0.2)
        ranks = [p for p in _trainer_pids(str(tmp_path)) if p != proc.pid]  # not torchrun
        assert len(ranks) >= 2, ranks
        for pid in ranks:  # a step in progress, frozen past the grace period
            os.kill(pid, signal.SIGSTOP)
        os.kill(proc.pid, signal.SIGUSR1)  # torchrun forwards it, then kills after GRACE_S
        out = proc.communicate(timeout=120)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        for pid in _trainer_pids(str(tmp_path)):  # none should be left; never leave one
            os.kill(pid, signal.SIGKILL)
    rows = _rows(run_dir)
    # 32 completions of up to 128 tokens: >2 s a step on an idle 2-core machine (16 x 32: 0.8 s)
    assert all(r["time/step_s"] > GRACE_S for r in rows), [r["time/step_s"] for r in rows]
    assert "checkpointing every step while that lasts" in out
    assert proc.returncode != 0  # the ranks were killed, not finished
    ckpts = sorted(p for p in (run_dir / "checkpoints").glob("step_*") if p.name[5:].isdigit())
    assert ckpts, f"no checkpoint left:\n{out[-3000:]}"
    newest = int(ckpts[-1].name.split("_")[-1])
    assert newest >= rows[-1]["step"] - 1, (newest, rows[-1]["step"])  # at most one step lost
