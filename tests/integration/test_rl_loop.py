"""The RL loop end to end on a random tiny model: learning signal, resume, failure handling.

A JSONL task set with a regex verifier gives a random policy mixed rewards (the pattern matches
any answer holding a letter a-m), so GRPO advantages are non-zero from the first step.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from benchmarks.tiny_model import make_tiny_qwen2
from megatron_rl.config import load_config
from megatron_rl.domains import split_of
from megatron_rl.model import hf_io

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def setup_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("rl")
    make_tiny_qwen2(d / "model", "test", seed=0)
    rows = [
        {
            "prompt": f"Say something about {w}.",
            "gold": "a",
            "verifier": "regex",
            "pattern": "[\\s\\S]*[a-m][\\s\\S]*",
        }
        for w in ["cats", "dogs", "rain", "sun", "tea", "maps", "jazz", "snow"] * 4
    ]
    rows = [dict(r, prompt=r["prompt"] + f" #{i}") for i, r in enumerate(rows)]
    (d / "tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d


def overrides(d: Path, run: str, steps: int, *extra: str) -> list[str]:
    return [
        "rl.off_policy=false",  # the demo overlaps; these runs are on-policy unless they ask
        f"output_dir={d / 'runs'}",
        f"run_name={run}",
        f"model.hf_path={d / 'model'}",
        f"domains.task_files=[{d / 'tasks.jsonl'}]",
        "domains.include=['tasks/*']",
        f"train.steps={steps}",
        "train.threads=1",
        "train.lr=0.01",
        "rl.prompts_per_step=4",
        "rl.group_size=4",
        "eval.samples_per_domain=4",
        "eval.every=0",
        "rollout.max_new_tokens=8",
        "tracking.wandb=disabled",
        "tracking.progress=false",
        "checkpoint.every=1",
        # pin what the demo config tunes, so these tests do not follow its changes
        "domains.exclude=[]",
        "scheduler.filter_zero_variance=false",
        "scheduler.oversample=1.0",
        "train.lr_schedule=constant",
        *extra,
    ]


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def train_rows(run_dir: Path) -> list[dict]:
    return [m for m in metrics(run_dir) if "loss/total" in m or "rollout/samples" in m]


def test_two_steps_change_params_and_log_finite_metrics(setup_dir: Path) -> None:
    from megatron_rl.train.rl import train_rl

    # more held-out prompts asked for than the task set's eval split holds (8 of its 32)
    # and the sampled metric: pass@1 of 2 samples at T=1, plus the greedy pass beside it
    extra = ["eval.samples_per_domain=64", "eval.train_prompts=5"]
    extra += ["eval.samples_per_prompt=2", "eval.temperature=1.0", "eval.greedy_also=true"]
    cfg = load_config(ROOT / "configs/demo_cpu.yaml", overrides(setup_dir, "micro", 2, *extra))
    summary = train_rl(cfg)
    run = setup_dir / "runs" / "micro"
    assert set(summary) >= {"eval_before", "eval_after", "steps", "wall_s"}
    on_disk = json.loads((run / "summary.json").read_text())
    assert on_disk["steps"] == 2
    rows = [json.loads(x) for x in (setup_dir / "tasks.jsonl").read_text().splitlines()]
    n_eval = sum(split_of(r["prompt"]) == "eval" for r in rows)
    row = on_disk["domains"]["tasks/tasks"]
    assert row["distinct"] == n_eval and row["requested"] == 64  # each distinct prompt once
    assert row["train_distinct"] == 5
    for k in ("before", "after", "stderr_before", "stderr_after", "gain", "gain_stderr",
              "train_before", "train_after", "gap_before", "gap_after", "constant_baseline",
              "top_answer_share_before", "top_answer_share_after"):  # fmt: skip
        assert isinstance(row[k], float), (k, row)
    assert row["gain"] == pytest.approx(row["after"] - row["before"], abs=1e-6)
    assert row["gap_after"] == pytest.approx(row["train_after"] - row["after"], abs=1e-6)
    sweeps = [m for m in metrics(run) if "eval/tasks/tasks/distinct" in m]
    assert [m["eval/tasks/tasks/distinct"] for m in sweeps] == [n_eval, n_eval]
    assert all("eval_train/tasks/tasks/accuracy" in m for m in sweeps)  # start and end
    assert all(m["eval_greedy/tasks/tasks/distinct"] == n_eval for m in sweeps)
    assert on_disk["metric"] == {"samples_per_prompt": 2, "temperature": 1.0}
    assert set(on_disk["greedy_after"]) == set(on_disk["eval_after"])
    scored = [json.loads(x) for x in (run / "eval_failures.jsonl").read_text().splitlines()]
    assert {r["score"] for r in scored} <= {0.0, 0.5, 1.0}  # a prompt scores its 2 samples' mean
    rows = train_rows(run)
    assert [r["step"] for r in rows] == [0, 1]
    for r in rows:
        assert r["rollout/samples"] == 16 and r["rollout/samples_trained"] == 16
        for k in ("loss/total", "train/grad_norm", "mismatch/logp_abs_mean", "time/step_s"):
            assert math.isfinite(r[k]), (k, r[k])
        # Trainer (Megatron, fp32) and engine (transformers, fp32) compute the same log-probs
        # with different kernels and summation orders: fp32 rounding gives ~1e-6 per token,
        # so 1e-3 nats is a wide margin that still catches a wrong temperature, an
        # off-by-one alignment or stale engine weights (those give errors of 0.1-5 nats).
        assert r["mismatch/logp_abs_max"] < 1e-3
    assert rows[0]["train/grad_norm"] > 0
    # a step's clock starts where the previous one's metrics were taken: step 1 carries step
    # 0's logging and checkpoint, and the phases never exceed the step
    assert "time/log_s" not in rows[0] and rows[1]["time/log_s"] > 0
    assert rows[1]["time/checkpoint_s"] > 0 and rows[1]["time/step_cpu_s"] > 0
    for r in rows:
        phases = sum(v for k, v in r.items() if k.startswith("time/") and k.endswith("_s")
                     and k not in ("time/step_s", "time/step_cpu_s"))  # fmt: skip
        assert phases <= r["time/step_s"] + 1e-6
    # weight sync on CPU goes through safetensors on local disk (rollout.sync_mode: disk)
    assert (run / "sync" / "model.safetensors").is_file()
    assert all(r["sync/write_seconds"] > 0 and r["sync/bytes"] > 0 for r in rows)
    before, _ = hf_io.load_hf(setup_dir / "model")
    after, _ = hf_io.load_hf(run / "checkpoints" / "step_000001" / "hf")
    changed = sum(not torch.equal(before[k], after[k]) for k in before)
    assert changed == len(before), f"only {changed}/{len(before)} tensors changed"


def _cli(d: Path, run: str, steps: int, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "launch.cli",
        "train",
        str(ROOT / "configs/demo_cpu.yaml"),
        *overrides(d, run, steps, *extra),
    ]


def test_resume_after_kill_repeats_and_skips_nothing(setup_dir: Path) -> None:
    from megatron_rl.train.checkpoint import CheckpointManager

    run = setup_dir / "runs" / "killed"
    cmd = _cli(setup_dir, "killed", 5)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    log = setup_dir / "killed.log"
    ckpts = CheckpointManager(run)
    with log.open("w") as err:
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True
        )
        # kill at the first complete checkpoint (any step: on a loaded machine the poll can
        # wake after a later one, and keep=2 prunes the oldest); a crash ends the wait at once
        deadline = time.time() + 600
        while time.time() < deadline and not ckpts.list() and proc.poll() is None:
            time.sleep(0.1)
        alive = proc.poll() is None
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    tail = log.read_text()[-3000:]
    assert alive, f"the run ended (rc {proc.returncode}) before it was killed:\n{tail}"
    assert ckpts.list(), f"no checkpoint within 600 s:\n{tail}"
    killed_at = CheckpointManager.step_of(ckpts.latest())
    assert killed_at < 5, killed_at
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    steps = [r["step"] for r in train_rows(run)]
    assert steps == [0, 1, 2, 3, 4], (killed_at, steps)
    assert json.loads((run / "summary.json").read_text())["completed"] is True


def test_verifier_errors_nan_loss_and_empty_batches_are_counted(setup_dir, monkeypatch) -> None:
    from megatron_rl.domains.jsonl import JsonlDomain
    from megatron_rl.train import step as rl_step
    from megatron_rl.train.rl import train_rl

    calls = {"n": 0}
    real_verify = JsonlDomain.verify

    def flaky_verify(self, task, response):  # one call in 16 raises: its group is dropped
        calls["n"] += 1
        if calls["n"] % 16 == 0:
            raise RuntimeError("verifier exploded")
        return real_verify(self, task, response)

    real_loss = rl_step.rl_loss

    def nan_loss(*a, **k):
        loss, m = real_loss(*a, **k)
        return loss * float("nan"), m

    monkeypatch.setattr(JsonlDomain, "verify", flaky_verify)
    monkeypatch.setattr(rl_step, "rl_loss", nan_loss)
    # inline domain calls (domains.workers=0), so the patched verifier is the one that runs
    over = [*overrides(setup_dir, "faulty", 2), "domains.workers=0"]
    train_rl(load_config(ROOT / "configs/demo_cpu.yaml", over))
    rows = train_rows(setup_dir / "runs" / "faulty")
    assert all(r["rollout/verifier_errors"] > 0 for r in rows)
    assert all(r["rollout/groups_dropped"] > 0 and r["rollout/groups_trained"] > 0 for r in rows)
    assert all(any(k.endswith("/verify_error") for k in r) for r in rows)
    assert all(r["train/nan_loss"] == 1.0 and r["train/skipped_steps"] == 1.0 for r in rows)
    before, _ = hf_io.load_hf(setup_dir / "model")
    after, _ = hf_io.load_hf(setup_dir / "runs" / "faulty" / "checkpoints" / "step_000001" / "hf")
    assert all(torch.equal(before[k], after[k]) for k in before), "NaN step changed weights"


def test_all_groups_filtered_gives_empty_batch_event(setup_dir: Path, monkeypatch) -> None:
    from megatron_rl.train.rl import train_rl

    cfg = load_config(
        ROOT / "configs/demo_cpu.yaml",
        overrides(
            setup_dir,
            "empty",
            1,
            "scheduler.filter_zero_variance=true",
            "rollout.max_new_tokens=1",
            "rl.group_size=1",
        ),
    )
    train_rl(cfg)
    run = setup_dir / "runs" / "empty"
    rows = train_rows(run)
    assert rows[0]["rollout/groups_filtered"] == 4 and rows[0]["rollout/samples_trained"] == 0
    events = [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()]
    assert any(e["event"] == "empty_batch" for e in events)


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ("model.hf_path={bad}", "config.json"),
        ("rollout.engine=nosuch", "nosuch"),
    ],
)
def test_bad_model_or_engine_is_one_clear_line(setup_dir: Path, extra: str, needle: str) -> None:
    bad = setup_dir / "not_a_model"
    bad.mkdir(exist_ok=True)
    cmd = _cli(setup_dir, "bad", 1, extra.format(bad=bad))
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert "megatron-rl train: error:" in last and needle in last, out.stderr[-1500:]
    assert "Traceback" not in out.stderr


def test_off_policy_overlaps_with_staleness_one(setup_dir: Path) -> None:
    from megatron_rl.train.rl import train_rl

    cfg = load_config(
        ROOT / "configs/demo_cpu.yaml", overrides(setup_dir, "offpol", 3, "rl.off_policy=true")
    )
    train_rl(cfg)
    rows = train_rows(setup_dir / "runs" / "offpol")
    assert [r["rollout/staleness"] for r in rows] == [0, 1, 1]
    assert all(r["rollout/samples_trained"] == 16 for r in rows)
    # samples one version old: the mismatch now includes the policy change, and is logged
    assert rows[1]["mismatch/logp_abs_mean"] > rows[0]["mismatch/logp_abs_mean"]


def test_kl_to_frozen_reference(setup_dir: Path) -> None:
    from megatron_rl.train.rl import train_rl

    cfg = load_config(
        ROOT / "configs/demo_cpu.yaml",
        overrides(setup_dir, "kl", 2, "rl.kl_coef=0.1", "rl.kl_estimator=k3"),
    )
    train_rl(cfg)
    rows = train_rows(setup_dir / "runs" / "kl")
    # step 0: the policy is the reference, so the k3 estimate is exactly 0; after an update > 0
    assert rows[0]["loss/kl"] == pytest.approx(0.0, abs=1e-7)
    assert rows[1]["loss/kl"] > 0
