"""A run directory loses nothing: torn logs resume, bad checkpoints and refusals write nothing.

Real ``megatron-rl train`` runs (the CLI entry point, in this process) of a random tiny model on
a JSONL task set. One finished 2-step run (a checkpoint per step) is copied for each case, so the
cases do not depend on each other:

* a torn last line of ``metrics.jsonl`` (a kill during an append): the resume drops it with one
  warning and continues (on main, every resume failed with ``JSONDecodeError``);
* ``checkpoint.resume=false`` over the finished run: refused in one line naming the run
  directory and both ways out, the directory byte-identical (on main, its metrics and events
  were deleted and its config overwritten);
* a start that fails after the run directory exists (a damaged rank file, one holding code, a
  checkpoint of format 1): the directory byte-identical, hashed file by file with modification
  times (on main, ``config.yaml`` was written before the checkpoint loaded); the format-1 one
  resumes with ``checkpoint.allow_legacy=true``;
* ``--overwrite``: a fresh run over the old one, whose checkpoints and logs are gone.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from benchmarks.tiny_model import make_tiny_qwen2
from launch import cli
from megatron_rl.train.checkpoint import CheckpointManager

ROOT = Path(__file__).resolve().parents[2]
CONFIG = str(ROOT / "configs/demo_cpu.yaml")


def _overrides(d: Path, run: str, steps: int) -> list[str]:
    return [
        "rl.off_policy=false",
        f"output_dir={d / 'runs'}",
        f"run_name={run}",
        f"model.hf_path={d / 'model'}",
        f"domains.task_files=[{d / 'tasks.jsonl'}]",
        "domains.include=['tasks/*']",
        "domains.exclude=[]",
        f"train.steps={steps}",
        "train.threads=1",
        "rl.prompts_per_step=2",
        "rl.group_size=2",
        "eval.samples_per_domain=2",
        "eval.every=0",
        "rollout.max_new_tokens=4",
        "checkpoint.every=1",
        "tracking.wandb=disabled",
        "tracking.progress=false",
        "scheduler.filter_zero_variance=false",
        "scheduler.oversample=1.0",
    ]


def train(d: Path, run: str, steps: int, *extra: str) -> int:
    return cli.main(["train", CONFIG, *_overrides(d, run, steps), *extra])


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("safety")
    make_tiny_qwen2(d / "model", "test", seed=0)
    rows = [{"prompt": f"Say {w}. #{i}", "gold": "a", "verifier": "regex", "pattern": "[a-m]"}
            for i, w in enumerate(["cats", "dogs", "rain", "sun"] * 4)]  # fmt: skip
    (d / "tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert train(d, "done", 2) == 0
    return d


def copy_of(d: Path, name: str) -> Path:
    run = d / "runs" / name
    shutil.copytree(d / "runs" / "done", run)
    return run


def tree_hash(root: Path) -> dict[str, str]:
    """Relative path -> sha256 of the bytes and the mtime (ns) of every file and folder."""
    out = {}
    for p in sorted(root.rglob("*")):
        body = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
        out[str(p.relative_to(root))] = f"{body}@{p.lstat().st_mtime_ns}"
    return out


def error_lines(capsys: pytest.CaptureFixture[str]) -> list[str]:
    """The CLI's one-line errors on stderr (library warnings may print there too)."""
    err = capsys.readouterr().err.splitlines()
    return [line for line in err if line.startswith("megatron-rl train: error:")]


def steps_logged(run: Path) -> list[int]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["step"] for r in rows if "loss/total" in r]


def test_a_resume_after_a_torn_metrics_line_succeeds(
    finished: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run = copy_of(finished, "torn")
    with (run / "metrics.jsonl").open("a") as f:
        f.write('{"step": 2, "loss/total": 0.')  # SIGKILL in the middle of an append
    with caplog.at_level(logging.WARNING):
        assert train(finished, "torn", 3) == 0
    torn = [r for r in caplog.records if "torn last line" in r.getMessage()]
    assert len(torn) == 1, [r.getMessage() for r in torn]
    assert steps_logged(run) == [0, 1, 2]
    assert json.loads((run / "summary.json").read_text())["completed"] is True


def test_rank_files_load_weights_only_in_a_process_without_megatron(finished: Path) -> None:
    """Importing megatron-core allow-lists more globals for weights-only loading (numpy arrays,
    its config classes); a rank file, the controller's trainer state included, needs none."""
    ckpt = CheckpointManager(finished / "runs" / "done").latest()
    assert ckpt is not None
    code = (
        "import sys, torch; s = torch.load(sys.argv[1], weights_only=True); "
        "assert 'megatron' not in sys.modules; print(sorted(s), sorted(s['trainer']))"
    )
    out = subprocess.run([sys.executable, "-c", code, str(ckpt / "rank_00000.pt")],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert "'rng'" in out.stdout and "'scheduler'" in out.stdout


def test_resume_false_over_a_finished_run_is_refused_and_writes_nothing(
    finished: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = copy_of(finished, "refused")
    before = tree_hash(run)
    assert train(finished, "refused", 2, "checkpoint.resume=false") == 2
    err = error_lines(capsys)
    assert len(err) == 1 and str(run) in err[0], err
    assert "checkpoint.resume=true" in err[0] and "--overwrite" in err[0]
    assert tree_hash(run) == before


class Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.mkdir, (str(self.marker),))


def _damage(ckpt: Path, how: str, marker: Path) -> None:
    rank_file = ckpt / "rank_00000.pt"
    if how == "garbage":
        rank_file.write_bytes(b"\x00" * 64)
    elif how == "code":
        torch.save({"model": Payload(marker)}, rank_file)
    else:  # format 1: the RNG states as the generators' own objects (numpy's ndarray)
        state = torch.load(rank_file, weights_only=True)
        state["rng"] = {"python": random.getstate(), "numpy": np.random.get_state(),
                        "torch": torch.get_rng_state()}  # fmt: skip
        torch.save(state, rank_file)
        meta = json.loads((ckpt / "meta.json").read_text())
        (ckpt / "meta.json").write_text(json.dumps({**meta, "format_version": 1}))


@pytest.mark.parametrize(
    ("how", "needle"),
    [
        ("garbage", "does not load as tensors and plain data"),
        ("code", "does not load as tensors and plain data"),
        ("format1", "checkpoint.allow_legacy=true"),
    ],
)
def test_a_start_that_fails_on_its_checkpoint_leaves_the_run_dir_byte_identical(
    finished: Path, capsys: pytest.CaptureFixture[str], how: str, needle: str
) -> None:
    run = copy_of(finished, f"bad_{how}")
    marker = finished / f"ran_{how}"
    latest = CheckpointManager(run).latest()
    assert latest is not None and latest.name == "step_000001"
    _damage(latest, how, marker)
    before = tree_hash(run)
    assert train(finished, f"bad_{how}", 3) == 2
    err = error_lines(capsys)
    assert len(err) == 1 and needle in err[0], err
    assert tree_hash(run) == before and not marker.exists()
    if how == "format1":  # the documented way to resume it
        assert train(finished, f"bad_{how}", 3, "checkpoint.allow_legacy=true") == 0
        assert steps_logged(run) == [0, 1, 2]
        assert CheckpointManager.format_of(CheckpointManager(run).latest() or run) == 2


def test_overwrite_starts_afresh_over_a_finished_run(finished: Path) -> None:
    run = copy_of(finished, "again")
    (run / "job.sbatch").write_text("#!/bin/sh\n")  # the launcher's file stays
    assert train(finished, "again", 1, "--overwrite") == 0
    assert steps_logged(run) == [0]
    assert [p.name for p in CheckpointManager(run).list()] == ["step_000000"]
    assert json.loads((run / "summary.json").read_text())["steps"] == 1
    assert (run / "job.sbatch").is_file()
