"""A ``run_name`` that would leave ``output_dir`` is refused by the CLI and writes nothing.

The real ``megatron-rl`` entry point runs in a fresh temporary working directory (the run
directory is ``<cwd>/runs/<run_name>``), once in a subprocess per command that takes a run
config (train, sft, submit) and in-process for more hostile names; the whole temporary tree is
listed before and after, and the config is shown to be valid with a plain ``run_name``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from launch import cli
from launch.commands.submit import load_with_slurm
from megatron_rl.config import load_config

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "demo_cpu.yaml"  # valid as it is: only run_name is bad below
COMMANDS = ("train", "sft", "submit")


def _listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.fixture
def cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    work = tmp_path / "a" / "b"  # '../x' and '../../x' stay inside tmp_path
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    return work


def test_the_config_is_valid_with_a_plain_run_name(cwd: Path) -> None:
    assert load_config(CONFIG, ["run_name=ok"]).run_dir == Path("runs/ok")
    cfg, _ = load_with_slurm(str(CONFIG), ["run_name=ok"])
    assert cfg.run_name == "ok"


@pytest.mark.parametrize("command", COMMANDS)
def test_dotdot_run_name_is_refused_and_writes_nothing(
    cwd: Path, tmp_path: Path, command: str
) -> None:
    before = _listing(tmp_path)
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    env = os.environ | {"PYTHONPATH": path}  # this checkout's launch/ and megatron_rl/
    out = subprocess.run(
        [sys.executable, "-m", "launch.cli", command, str(CONFIG), "run_name=../x"],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 2, out.stdout + out.stderr
    err = out.stderr.strip().splitlines()[-1]
    assert err.startswith(f"megatron-rl {command}: error: run_name='../x' is refused"), err
    assert "one folder inside output_dir" in err
    assert _listing(tmp_path) == before


HOSTILE = [
    "..", ".", "../../x", "a/b", "a\\b", "..\\x", "x/../../y", "x\x1by", "x\x7fy", "\u202ex",
    "x" * 300,
]  # fmt: skip


@pytest.mark.parametrize("command", COMMANDS)
def test_hostile_run_names_are_refused_and_write_nothing(
    cwd: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    before = _listing(tmp_path)
    for name in [*HOSTILE, str(tmp_path / "abs"), str(cwd / "runs" / "x")]:
        assert cli.main([command, str(CONFIG), f"run_name={name}"]) == 2, name
        err = capsys.readouterr().err
        assert "error: run_name=" in err and "is refused" in err, (name, err)
        assert _listing(tmp_path) == before, name
