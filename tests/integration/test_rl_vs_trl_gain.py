"""Time to +10 over paired seeds (benchmarks/rl_vs_trl_gain.py): its quick mode runs one seed of
all three runs (megatron-rl and TRL at once, then the demo recipe) into a scratch store, keeps
each run's traces, recomputes its statistics and draws the picture; a stored seed is reused, and
changed settings are refused. The tracked store's statistics recompute. No timing is asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from benchmarks import rl_vs_trl_gain as g
from benchmarks.studies.stored_runs import read

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "benchmarks.rl_vs_trl_gain", *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)


def test_quick_seed_runs_all_three_and_recomputes(tmp_path: Path) -> None:
    store, runs = tmp_path / "gain.json", tmp_path / "runs"
    base = ["--quick", f"--store={store}", f"--run-dir={runs}"]
    proc = _run(*base, "--seeds", "1", f"--json={tmp_path / 'res.json'}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    sec = read(store)["sections"]["gain"]
    assert sec["settings"] == g.QUICK
    for arm in g.ARMS:
        run = sec["runs"][arm]["1"]
        steps = len(run["step_s"])
        assert steps == g.QUICK["steps"], arm
        assert len(run["reward"]) == len(run["grad_norm"]) == steps, arm
        assert 0.0 <= run["start"] <= 1.0 and run["evals"], arm
    res = json.loads((tmp_path / "res.json").read_text())
    assert set(res["time_to_10"]["per_seed"]) == {"1"}
    assert res["runs"]["trl"]["1"]["reward"] == sec["runs"]["trl"]["1"]["reward"]
    assert "megatron-rl / TRL like for like" in proc.stdout
    assert _run(*base, "--check").returncode == 0
    plot = _run(*base, f"--plot={tmp_path / 'gain.png'}")
    assert plot.returncode == 0 and (tmp_path / "gain.png").stat().st_size > 10_000
    again = _run(*base, "--seeds", "1")  # stored: nothing runs again
    assert again.returncode == 0 and "and TRL at once" not in again.stdout
    doc = read(store)
    doc["sections"]["gain"]["settings"]["cap_s"] = 1.0
    store.write_text(json.dumps(doc))
    refused = _run(*base, "--seeds", "1")
    assert refused.returncode != 0 and "was run with" in refused.stderr


def test_stored_study_recomputes() -> None:
    proc = _run("--check")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "recomputed and agrees" in proc.stdout
