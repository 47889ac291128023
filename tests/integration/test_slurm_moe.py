"""The Slurm job for a mixture-of-experts run with expert parallelism (configs/moe_cpu.yaml).

``megatron-rl submit --dry-run`` renders the sbatch script for a GPU layout (2 nodes: 8 trainer
ranks with EP=4 x TP=2, 8 SGLang servers) and for the CPU layout the local-Slurm tests use
(one node, 2 trainer ranks with EP=2, embedded servers). The rendered script is valid bash, the
trainer gets the EP overrides, and the servers get the same overrides (they read the run config
to decide on ``--enable-return-routed-experts``). An EP that does not fit the job's trainer
world fails before anything is written, naming the keys.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from launch.commands.submit import load_with_slurm

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "moe_cpu.yaml"


def _submit(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "launch.cli", "submit", str(CONFIG), "--dry-run",
           f"output_dir={tmp_path}", *args]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=REPO)


@pytest.mark.parametrize("layout", [
    ["--nodes", "2", "slurm.gpus_per_node=8", "slurm.gpus_per_server=1", "parallel.ep=4",
     "parallel.tp=2"],
    ["--nodes", "1", "slurm.gpus_per_node=0", "slurm.gpus_per_server=0",
     "slurm.server_engine=hf", "slurm.trainer_procs_per_node=2", "parallel.ep=2"],
])  # fmt: skip
def test_moe_job_with_expert_parallelism_renders(tmp_path: Path, layout: list[str]) -> None:
    out = _submit(tmp_path, *layout)
    assert out.returncode == 0, out.stderr
    s = out.stdout
    ep = next(o for o in layout if o.startswith("parallel.ep="))
    train = next(line for line in s.splitlines() if " train " in line and "$CONFIG" in line)
    assert ep in train and "rollout.engine=sglang" in train
    serve = next(
        line for line in s.splitlines() if "--health-timeout" in line and "ROUTER_ARG" in line
    )
    assert ep in serve  # the servers see the run's overrides too
    assert '--nproc-per-node="$TRAINER_PROCS"' in s
    assert "{{" not in s and "{%" not in s
    check = subprocess.run(["bash", "-n"], input=s, capture_output=True, text=True, timeout=30)
    assert check.returncode == 0, check.stderr
    assert not any(tmp_path.iterdir())  # a dry run writes nothing


@pytest.mark.parametrize(("overrides", "message"), [
    (["slurm.nodes=2", "slurm.gpus_per_server=1", "parallel.ep=3"],
     r"parallel.ep=3 must divide model.moe.num_experts=8"),
    (["slurm.nodes=1", "slurm.gpus_per_node=0", "slurm.gpus_per_server=0",
      "slurm.server_engine=hf", "slurm.trainer_procs_per_node=2", "parallel.ep=4"],
     r"world size 2 is not divisible by parallel.ep \* etp \* pp = 4 \* 1 \* 1 = 4.*"
     r"trainer world: 1 node\(s\) x 2 rank\(s\)"),
])  # fmt: skip
def test_expert_layout_that_does_not_fit_the_job_is_one_line(overrides, message) -> None:
    with pytest.raises(ValueError, match=message) as err:
        load_with_slurm(str(CONFIG), overrides)
    assert "\n" not in str(err.value)
