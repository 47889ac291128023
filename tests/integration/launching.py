"""Launching torchrun (or any launcher) from a test: in its own session, so a hang is killed
whole (torchrun's workers included) when the test's time limit runs out."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")


def launch(
    cmd: list[str], timeout: int, what: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` from the repository root; pytest.fail naming ``what`` (default: the last
    argument) if it has not finished within ``timeout`` seconds."""
    proc = subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"{what or cmd[-1]} did not finish within {timeout} s (hang?)")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def torchrun(nproc: int, args: list[str], timeout: int, what: str = "torchrun") -> str:
    """``torchrun --standalone --nproc_per_node nproc *args``, which must exit 0; its stderr."""
    res = launch([*TORCHRUN, "--nproc_per_node", str(nproc), *args], timeout, what)
    assert res.returncode == 0, f"{what} failed:\n{res.stderr[-3000:]}"
    return res.stderr
