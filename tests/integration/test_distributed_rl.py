"""The RL loop as a distributed program: one controller, DP shares, TP/PP ranks in lockstep.

Two torchrun launches of ``tests/integration/dist/rl_layouts.py`` (gloo on CPU, real
megatron-core, the real HF engine) run 2 RL steps each:

- one process (DP=1) records every ``generate`` call of the one engine;
- two processes replay those calls (so only the layout differs) under DP=2, TP=2 and PP=2;
- a *thin* run in which one group is kept per step (fewer groups than DP ranks) and an
  off-policy run (the controller prefetches step t+1 while the ranks train step t), each
  recorded on one process and replayed on two (DP=2).

The final checkpoints' HF weights must match the single-process run within 1e-5 (fp32). The
learning rate is small and Adam's epsilon well above fp32 noise in near-zero gradients, as in
``test_parallel_equivalence.py``: Adam otherwise turns rounding differences of the reductions
(1e-7) into parameter differences near its step size. Weights still move ~100x the tolerance.

Also here: a 2-rank run killed mid-step resumes with each step logged once, and bad layouts fail
at start-up with one line naming the keys and nothing written.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest
import torch
from launching import ENV, TORCHRUN, launch

from benchmarks.tiny_model import make_tiny_qwen2
from megatron_rl.config import load_config
from megatron_rl.model import hf_io

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "tests" / "integration" / "dist" / "rl_layouts.py"
CONFIG = ROOT / "configs" / "demo_cpu.yaml"
# the engine stays in the controller's process (rollout.process=same), where the worker records
# and replays its generate calls; the child-process engine is tested in test_process_engine.py
OFF = "rl.off_policy=true;rollout.process=same"
ONE_PROC_RUNS = f"dp1,thin_ref,offpol_ref:{OFF}"
TWO_PROC_RUNS = (
    f"dp2/dp1,tp2/dp1:parallel.tp=2,pp2/dp1:parallel.pp=2,thin/thin_ref,offpol/offpol_ref:{OFF}"
)


def base_overrides(d: Path, steps: int = 2) -> list[str]:
    return [
        "rl.off_policy=false",  # the demo overlaps; the layouts compare on-policy runs
        f"output_dir={d / 'runs'}",
        f"model.hf_path={d / 'model'}",
        f"domains.task_files=[{d / 'tasks.jsonl'}]",
        "domains.include=['tasks/*']",
        "domains.exclude=[]",
        f"train.steps={steps}",
        "train.threads=1",
        "train.lr=0.001",
        "train.adam_eps=1e-4",
        "train.lr_schedule=constant",
        "train.micro_batch_tokens=160",  # several micro-batches per share
        "rl.prompts_per_step=8",
        "rl.group_size=4",
        "eval.samples_per_domain=4",
        "eval.every=0",
        "rollout.max_new_tokens=16",
        "scheduler.filter_zero_variance=false",
        "scheduler.oversample=1.0",
        "tracking.wandb=disabled",
        "tracking.progress=false",
        "checkpoint.every=1",
    ]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("dist_rl")
    make_tiny_qwen2(d / "model", "test", seed=0)
    words = ["cats", "dogs", "rain", "sun", "tea", "maps", "jazz", "snow"] * 4
    rows = [  # prompts of mixed lengths; the random model's answers vary in length too
        {"prompt": f"Say something about {w}" + " and more" * (i % 4) + f". #{i}", "gold": "a",
         "verifier": "regex", "pattern": "[\\s\\S]*[a-m][\\s\\S]*"}
        for i, w in enumerate(words)
    ]  # fmt: skip
    (d / "tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "base.json").write_text(
        json.dumps({"config": str(CONFIG), "overrides": base_overrides(d)})
    )
    for sub in ("out", "groups"):
        (d / sub).mkdir()
    return d


@pytest.fixture(scope="module")
def runs(data: Path) -> Path:
    """The 1-process reference launch (recording), then the 2-process launch (replaying)."""
    for nproc, mode, spec in ((1, "record", ONE_PROC_RUNS), (2, "replay", TWO_PROC_RUNS)):
        args = [
            "--out-dir",
            data / "out",
            "--base",
            data / "base.json",
            "--groups",
            data / "groups",
        ]
        cmd = [*TORCHRUN, "--nproc_per_node", str(nproc), str(WORKER), *map(str, args)]
        done = launch([*cmd, "--mode", mode, spec], timeout=600)
        assert done.returncode == 0, f"{spec} failed:\n{done.stderr[-3000:]}"
    return data


def ranks(d: Path, run: str) -> list[dict]:
    return [json.loads((d / "out" / f"{run}.rank{r}.json").read_text())
            for r in range(2 if (d / "out" / f"{run}.rank1.json").exists() else 1)]  # fmt: skip


def final_weights(d: Path, run: str) -> dict[str, torch.Tensor]:
    return hf_io.load_hf(d / "runs" / run / "checkpoints" / "step_000001" / "hf")[0]


def max_weight_diff(d: Path, a: str, b: str) -> float:
    wa, wb = final_weights(d, a), final_weights(d, b)
    assert wa.keys() == wb.keys()
    return max(float((wa[k] - wb[k]).abs().max()) for k in wa)


def test_weights_moved_far_beyond_the_tolerance(runs: Path) -> None:
    start = hf_io.load_hf(runs / "model")[0]
    end = final_weights(runs, "dp1")
    assert max(float((start[k] - end[k]).abs().max()) for k in start) > 1e-3


@pytest.mark.parametrize("run", ["dp2", "tp2", "pp2"])
def test_two_ranks_equal_one_rank(runs: Path, run: str) -> None:
    assert max_weight_diff(runs, "dp1", run) < 1e-5
    ref = [
        json.loads(x) for x in (runs / "runs" / "dp1" / "metrics.jsonl").read_text().splitlines()
    ]
    got = [json.loads(x) for x in (runs / "runs" / run / "metrics.jsonl").read_text().splitlines()]
    for a, b in zip(ref, got, strict=True):  # metrics reduced over DP: the global values
        for key in ("train/response_tokens", "rollout/samples_trained"):
            assert a.get(key) == b.get(key), key
        if "train/grad_norm" in a:
            assert b["train/grad_norm"] == pytest.approx(a["train/grad_norm"], rel=1e-4)


def test_dp_ranks_train_disjoint_balanced_shares(runs: Path) -> None:
    r0, r1 = ranks(runs, "dp2")
    (ref,) = ranks(runs, "dp1")
    assert (r0["dp_rank"], r1["dp_rank"], r0["dp"]) == (0, 1, 2)
    for s0, s1, whole in zip(r0["steps"], r1["steps"], ref["steps"], strict=True):
        # every sequence of the DP=1 step is trained exactly once, on one of the two ranks
        assert Counter(map(tuple, s0["seqs"])) + Counter(map(tuple, s1["seqs"])) == Counter(
            map(tuple, whole["seqs"])
        )
        assert s0["seqs"] and s1["seqs"] and s0["hash"] != s1["hash"]
        tokens = [s0["packed"], s1["packed"]]
        assert tokens == s0["tokens"] == s1["tokens"]  # what the controller says it shipped
        assert sum(tokens) < sum(map(len, whole["seqs"]))  # each group's prompt packed once
        assert max(tokens) <= 1.25 * min(tokens), tokens
        assert len(set(map(len, whole["seqs"]))) > 4  # a mixed-length batch


@pytest.mark.parametrize("run", ["tp2", "pp2"])
def test_model_parallel_ranks_hold_identical_batches(runs: Path, run: str) -> None:
    r0, r1 = ranks(runs, run)
    assert r0["dp"] == r1["dp"] == 1 and r0["dp_rank"] == r1["dp_rank"] == 0
    assert [s["hash"] for s in r0["steps"]] == [s["hash"] for s in r1["steps"]]
    (ref,) = ranks(runs, "dp1")
    assert [s["hash"] for s in r0["steps"]] == [s["hash"] for s in ref["steps"]]


@pytest.mark.parametrize("run", ["dp2", "tp2", "pp2"])
def test_one_engine_one_rollout_per_step(runs: Path, run: str) -> None:
    """Only rank 0 builds an engine; it gets the same generate calls as a one-rank run."""
    r0, r1 = ranks(runs, run)
    (ref,) = ranks(runs, "dp1")
    # held-out and training-prompt sweeps before and after (eval.train_prompts), 2 steps
    assert ref["engines"] == 1 and ref["generate_calls"] == 2 * 2 + 2
    assert (r0["engines"], r0["generate_calls"]) == (ref["engines"], ref["generate_calls"])
    assert (r1["engines"], r1["generate_calls"]) == (0, 0)


def test_thin_step_rank_without_data_trains_zero_weight_batch(runs: Path) -> None:
    r0, r1 = ranks(runs, "thin")
    for s0, s1 in zip(r0["steps"], r1["steps"], strict=True):
        assert s0["train"] and s1["train"]
        assert len(s0["seqs"]) == 4 and s1["seqs"] == [] and s1["zero_batches"] >= 1
    assert max_weight_diff(runs, "thin_ref", "thin") < 1e-5  # the zero batch adds no gradient
    assert max_weight_diff(runs, "thin_ref", "dp1") > 1e-4  # and the thin run did differ


def test_off_policy_prefetch_with_two_ranks(runs: Path) -> None:
    rows = [
        json.loads(x) for x in (runs / "runs" / "offpol" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [r["rollout/staleness"] for r in rows if "loss/total" in r] == [0, 1]
    assert max_weight_diff(runs, "offpol_ref", "offpol") < 1e-5
    assert max_weight_diff(runs, "offpol_ref", "dp1") > 1e-4  # step 1 trained on stale samples


def test_kill_two_rank_run_mid_step_and_resume(data: Path) -> None:
    run = data / "runs" / "killed"
    # with the pre-screen on: rank 0 screens before step 0 while rank 1 waits, and the resumed
    # run takes the checkpointed result instead of screening again
    overrides = [*base_overrides(data, steps=4), "run_name=killed", "scheduler.prescreen_groups=1"]
    cmd = [*TORCHRUN, "--nproc_per_node", "2", "-m", "launch.cli", "train", str(CONFIG), *overrides]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    deadline = time.time() + 300
    while time.time() < deadline and not (run / "checkpoints" / "step_000001").is_dir():
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)  # torchrun and both ranks, in step 2
    proc.wait()
    assert (run / "checkpoints" / "step_000001").is_dir(), "no checkpoint before the kill"
    done = launch(cmd, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss/total" in r] == [0, 1, 2, 3]
    ckpt = run / "checkpoints" / "step_000003"
    states = [torch.load(ckpt / f"rank_{r:05d}.pt", weights_only=True) for r in (0, 1)]
    assert set(states[0]["trainer"]) >= {"scheduler", "cursor"}  # the controller's, once
    assert states[1]["trainer"] == {} and states[1]["model"] and states[1]["optimizer"]
    assert json.loads((run / "summary.json").read_text())["completed"] is True
    screen = states[0]["trainer"]["prescreen"]
    assert screen == json.loads((run / "prescreen.json").read_text()) and screen["groups"] >= 1
    events = [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events].count("prescreen") == 1
    total = [r["rollout/groups_generated_total"] for r in rows if "loss/total" in r]
    assert total[-1] == screen["groups"] + 4 * 8  # the screen, then 4 steps of 8 groups


def test_layout_not_matching_world_fails_on_every_rank_before_writing(data: Path) -> None:
    overrides = [*base_overrides(data), "run_name=badlayout", "parallel.dp=4"]
    cmd = [*TORCHRUN, "--nproc_per_node", "2", "-m", "launch.cli", "train", str(CONFIG), *overrides]
    done = launch(cmd, timeout=300)
    assert done.returncode != 0
    errors = [x for x in done.stderr.splitlines() if "megatron-rl train: error:" in x]
    assert len(errors) == 2, done.stderr[-2000:]  # one line from each rank, nothing else
    assert all("parallel.dp * parallel.tp * parallel.pp * parallel.cp" in e for e in errors)
    assert "world size 2" in errors[0]
    assert not (data / "runs" / "badlayout").exists()


@pytest.mark.parametrize(
    ("extra", "world", "needle"),
    [
        (["rl.prompts_per_step=1"], 2, "rl.prompts_per_step=1 is below the data-parallel size 2"),
        (["rl.prompts_per_step=3", "parallel.tp=2"], 8, "prompts_per_step=3 is below .* size 4"),
        (["parallel.dp=3"], 2, r"parallel.dp \* parallel.tp .* = 3 is not the world size 2"),
        (["parallel.tp=2", "parallel.dp=2"], 2, r"= 4 is not the world size 2"),
    ],
)
def test_bad_layout_is_one_line_and_writes_nothing(
    data: Path, monkeypatch: pytest.MonkeyPatch, extra: list[str], world: int, needle: str
) -> None:
    """The start-up check runs before torch.distributed or the run directory exist."""
    from megatron_rl.train.rl import train_rl

    monkeypatch.setenv("WORLD_SIZE", str(world))
    cfg = load_config(CONFIG, [*base_overrides(data), "run_name=bad", *extra])
    before = torch.distributed.is_initialized()  # an earlier in-process run may have set it up
    with pytest.raises(ValueError, match=needle) as err:
        train_rl(cfg)
    assert "\n" not in str(err.value)
    assert not (data / "runs" / "bad").exists()
    assert torch.distributed.is_initialized() == before  # the check ran before any set-up
