"""launch/setup_env.sh: failed installs stop it with the package named; no root/sudo skips the
Debian stage with one line; CUDA machines get the pinned GPU stack.

The script runs for real on a throw-away ``VENV`` whose ``pip`` records its arguments (and fails
for one chosen package) and whose ``python`` is the project's interpreter, so nothing is
downloaded; ``nvidia-smi`` is faked on ``PATH`` for the CUDA case.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "launch" / "setup_env.sh"


def _fail(pkg: str) -> str:
    return f'case "$*" in *{pkg}*) echo "ERROR: no {pkg}" >&2; exit 1;; esac\n'


def _fake_venv(tmp: Path, fail_on: str = "") -> Path:
    venv = tmp / "venv"
    (venv / "bin").mkdir(parents=True)
    tools = {
        "python": f'exec {sys.executable} "$@"',
        "megatron-rl": f'exec {sys.executable} -m launch.cli "$@"',
        "pip": f'echo "pip $*" >> {tmp}/pip.log\n' + (_fail(fail_on) if fail_on else "") + "exit 0",
    }  # fmt: skip
    for name, body in tools.items():
        f = venv / "bin" / name
        f.write_text(f"#!/bin/sh\n{body}\n")
        f.chmod(0o755)
    return venv


def _run(tmp: Path, venv: Path, extra_env: dict[str, str] | None = None, user: bool = False):
    env = dict(os.environ, VENV=str(venv), PYTHONPATH=str(REPO), APT_PKGS="procps")
    env.update(extra_env or {})
    cmd = ["bash", str(SCRIPT)]
    if user:  # a real non-root user, as on a cluster login node
        cmd = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *cmd]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=tmp)


def test_a_failed_install_stops_setup_naming_the_package(tmp_path: Path) -> None:
    venv = _fake_venv(tmp_path, fail_on="megatron-core")
    out = _run(tmp_path, venv)
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("[setup] FAILED") and "megatron-core==0.16.1" in last, out.stderr
    assert not (venv / ".stamps" / "mcore").exists()
    assert "vllm" not in (tmp_path / "pip.log").read_text()  # nothing after it ran


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root+setpriv")
def test_without_root_or_sudo_the_debian_stage_is_skipped_with_one_line() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="mrl-setup-"))  # pytest's tmp is private to root
    try:
        venv = _fake_venv(tmp, fail_on="torch==")  # stop right after the Debian stage
        for d in (tmp, venv, venv / "bin"):
            os.chmod(d, 0o777)
        out = _run(tmp, venv, {"APT_PKGS": "procps mrl-absent-package", "PATH": "/usr/bin:/bin"},
                   user=True)  # fmt: skip
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    notes = [ln for ln in out.stderr.splitlines() if "Debian" in ln]
    assert notes == ["[setup] no root or sudo: skipping Debian packages; ask an admin to "
                     "install: mrl-absent-package"], out.stderr  # fmt: skip
    assert "installing torch" in out.stderr  # it went on to the Python stages


def test_cuda_machines_get_the_pinned_gpu_stack(tmp_path: Path) -> None:
    venv = _fake_venv(tmp_path)
    fake_bin = tmp_path / "fakebin"
    fake_bin.mkdir()
    smi = fake_bin / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 (UUID: GPU-0)'\n")
    smi.chmod(0o755)
    out = _run(tmp_path, venv, {"PATH": f"{fake_bin}:{os.environ['PATH']}"})
    pips = (tmp_path / "pip.log").read_text()
    assert "install torch==2.14.1" in pips and "sglang==0.5.23" in pips
    # No sglang here: its import check stops the set-up in one line naming it.
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert "FAILED" in last and "sglang==0.5.23" in last and "import sglang" in last, out.stderr
