"""CP start-up checks (issue 17): CP is accepted on CPU, refused only where it cannot run.

On CPU, ``parallel.cp > 1`` runs with ``long_context/cp_attention.py`` (issue 8 refused it here;
issue 17 drops that refusal). On GPU the CP attention is Transformer Engine's, so there, and only
there, a missing TE fails config loading. Layouts that cannot work fail at start-up with one line
naming the keys: a CP size that does not divide the world, and CP with PP on CPU.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from megatron_rl.config import load_config

ROOT = Path(__file__).resolve().parents[2]


def test_config_load_accepts_cp2_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert load_config(None, ["parallel.cp=2"]).parallel.cp == 2


def test_config_load_refuses_cp2_on_gpu_without_te(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "transformer_engine" else real_find_spec(name, *a),
    )
    with pytest.raises(ValueError, match=r"parallel.cp=2 on GPU needs Transformer Engine") as err:
        load_config(None, ["parallel.cp=2"])
    assert "\n" not in str(err.value)


def test_cp1_loads() -> None:
    assert load_config(None, ["parallel.cp=1"]).parallel.cp == 1


def _train_cli(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    cli = Path(sys.executable).parent / "megatron-rl"
    out_dir = tmp_path / "runs"
    return subprocess.run(
        [str(cli), "train", "configs/demo_cpu.yaml", f"output_dir={out_dir}", *overrides],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU start-up path")
def test_train_cli_cp_not_dividing_world_fails_at_start_up(tmp_path: Path) -> None:
    """One process, parallel.cp=2: one line naming parallel.cp, exit 2, nothing written."""
    out = _train_cli(tmp_path, "parallel.cp=2")
    assert out.returncode == 2
    assert "parallel.cp = 1 * 1 * 2" in out.stderr and "not divisible" in out.stderr
    assert "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists()
