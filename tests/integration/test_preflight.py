"""A failed start writes nothing: bad input after a finished run leaves its directory intact.

A real 2-step RL run (the `megatron-rl train` CLI in a subprocess, W&B offline so that its
folder exists) is hashed, file by file with contents and modification times; then the same
command is re-run with one bad input at a time through the CLI entry point, and the hash must
not change. Before train/preflight.py, the bad domain pattern (the issue's case) replaced
config.yaml with the invalid config, resumed and closed the W&B run and rewrote the logs.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks.tiny_model import make_tiny_qwen2
from launch import cli

ROOT = Path(__file__).resolve().parents[2]


def _overrides(d: Path) -> list[str]:
    return [
        "rl.off_policy=false",
        f"output_dir={d / 'runs'}",
        "run_name=done",
        f"model.hf_path={d / 'model'}",
        f"domains.task_files=[{d / 'tasks.jsonl'}]",
        "domains.include=['tasks/*']",
        "domains.exclude=[]",
        "train.steps=2",
        "train.threads=1",
        "rl.prompts_per_step=2",
        "rl.group_size=4",
        "eval.samples_per_domain=2",
        "eval.every=0",
        "rollout.max_new_tokens=4",
        "tracking.wandb=offline",
        "tracking.progress=false",
        "scheduler.filter_zero_variance=false",
        "scheduler.oversample=1.0",
    ]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("preflight")
    make_tiny_qwen2(d / "model", "test", seed=0)
    rows = [
        {"prompt": f"Say {w}.", "gold": "a", "verifier": "regex", "pattern": "[a-z]", "split": s}
        for w, s in zip(
            ["cats", "dogs", "rain", "sun", "tea", "jazz"],
            ["train"] * 4 + ["eval"] * 2,
            strict=True,
        )
    ]
    (d / "tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cmd = [sys.executable, "-m", "launch.cli", "train", str(ROOT / "configs/demo_cpu.yaml")]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_SILENT": "true"}
    env.pop("WANDB_API_KEY", None)
    out = subprocess.run(
        cmd + _overrides(d), cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-3000:]
    run = d / "runs" / "done"
    assert (run / "wandb").is_dir() and (run / "config.yaml").is_file()
    return d, run


def tree_hash(root: Path) -> dict[str, str]:
    """Relative path -> sha256 of the bytes and the mtime (ns) of every file and folder."""
    out = {}
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        body = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
        out[str(p.relative_to(root))] = f"{body}@{st.st_mtime_ns}"
    return out


BAD = [
    # (command, bad overrides, what the one-line error must name)
    ("train", ["domains.include=[nothing/*]"], "matches no registered domain"),
    ("train", ["domains.exclude=[nothing/*]"], "matches no registered domain"),
    ("train", ["domains.level=3"], "level=3 is not a level of"),
    ("train", ["rollout.engine=nosuch"], "rollout.engine='nosuch'"),
    ("train", ["rollout.engine=sglang"], "rollout.urls"),
    ("train", ["model.hf_path={d}/no_such_model"], "no_such_model"),
    ("train", ["model.hf_path={d}"], "config.json"),
    ("train", ["parallel.tp=2"], "world size 1 is not divisible"),
    ("train", ["parallel.pp=3"], "world size 1 is not divisible"),
    ("train", ["train.steps"], "must look like section.key=value"),
    ("train", ["train.steps=many"], "train.steps must be an integer"),
    ("train", ["rl.no_such_key=1"], "unknown config key"),
    ("train", ["slurm.time_limit=forever"], "slurm.time_limit"),
    ("sft", ["sft.data=domains", "domains.include=[nothing/*]"], "matches no registered domain"),
    ("sft", ["sft.data={d}/no_such.jsonl"], "no_such.jsonl"),
]


@pytest.mark.parametrize(("command", "bad", "needle"), BAD, ids=[" ".join(b[1]) for b in BAD])
def test_failed_start_leaves_the_run_directory_byte_identical(
    finished_run: tuple[Path, Path],
    capsys: pytest.CaptureFixture[str],
    command: str,
    bad: list[str],
    needle: str,
) -> None:
    d, run = finished_run
    before = tree_hash(run)
    assert len(before) > 10 and any(k.startswith("wandb/") for k in before)
    argv = [command, str(ROOT / "configs/demo_cpu.yaml"), *_overrides(d)]
    argv += [b.format(d=d) for b in bad]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"megatron-rl {command}: error:"), err
    assert needle in err[0], err[0]
    assert tree_hash(run) == before


def test_start_up_reads_config_json_and_checks_the_layout_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """setup_run reads the model's config.json and validates the layout once (preflight), and
    hands on the resolved model: the checkpoint's architecture with the run's options."""
    from megatron_rl.config import load_config
    from megatron_rl.model import hf_io, parallel
    from megatron_rl.train.runtime import setup_run

    calls: dict[str, int] = {"config.json": 0, "layout": 0}

    def counted(name: str, fn: Any) -> Any:
        def wrapper(*a: Any, **k: Any) -> Any:
            calls[name] += 1
            return fn(*a, **k)

        return wrapper

    monkeypatch.setattr(hf_io, "load_hf_config", counted("config.json", hf_io.load_hf_config))
    monkeypatch.setattr(parallel, "validate_layout", counted("layout", parallel.validate_layout))
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    make_tiny_qwen2(tmp_path / "model", "test", seed=0)
    rows = [{"prompt": "Say a.", "gold": "a", "verifier": "regex", "pattern": "[a-z]", "split": s}
            for s in ("train", "eval")]  # fmt: skip
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    overrides = [o for o in _overrides(tmp_path) if not o.startswith("tracking.wandb")]
    cfg = load_config(ROOT / "configs/demo_cpu.yaml", [*overrides, "tracking.wandb=disabled"])
    cfg.model.recompute = "full"  # a run's own option, kept over the checkpoint's
    rt = setup_run(cfg, "rl")
    rt.tracker.finish()
    assert calls == {"config.json": 1, "layout": 1}
    _, hf_model = hf_io.load_hf_config(tmp_path / "model")
    assert rt.cfg.model.hidden_size == hf_model.hidden_size != cfg.model.hidden_size
    assert rt.cfg.model.recompute == "full" and rt.policy.cfg is rt.cfg.model
