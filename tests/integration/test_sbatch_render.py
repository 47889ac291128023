"""The rendered sbatch script, executed by bash with the cluster's commands stubbed.

No Slurm here (tests/integration/test_slurm.py runs the real job on a real local cluster, CPU only):
the script `megatron-rl submit` renders runs as it is, but ``srun`` / ``scontrol`` / ``torchrun``
and the CLI are small recorders on PATH. ``srun`` gives every step a *non-identity*
``CUDA_VISIBLE_DEVICES`` (what Slurm writes on a shared node: global ids 3,5,6,7,10,11,14,15), so
the test sees which devices each step's processes would really bind, for the 1-node colocated job
and a 4-node disaggregated one, and whether every step runs in the container.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import stat
import subprocess
from pathlib import Path

import pytest

from launch.commands import serve
from launch.commands.submit import load_with_slurm, render_sbatch
from launch.server_args import assign_gpus

STEP_GPUS = "3,5,6,7,10,11,14,15"  # the step's devices, as Slurm would write them

STUB = """#!/bin/bash
# records one JSON line per call: which tool, its argv, the devices it sees; the appends of
# steps that run at once are serialised by flock (unlocked, two records once shared a line)
{
  flock 9
  python3 -c 'import json, os, sys; print(json.dumps({"tool": sys.argv[1], "argv": sys.argv[2:],
    "cvd": os.environ.get("CUDA_VISIBLE_DEVICES"), "container": os.environ.get("IN_CONTAINER")}))' \
    "$(basename "$0")" "$@" >> "$STUB_LOG"
} 9>> "$STUB_LOG.lock"
"""
SRUN = (
    STUB
    + """# a step: drop srun's options, give it the step's devices, run the command
for a in "$@"; do [[ "$a" == --container-image=* ]] && export IN_CONTAINER=1; done
while [ $# -gt 0 ] && [[ "$1" == -* ]]; do shift; done
export CUDA_VISIBLE_DEVICES="$FAKE_STEP_GPUS"
exec "$@"
"""
)
SCONTROL = (
    STUB
    + """if [ "$1" = show ]; then for i in $(seq 1 "$FAKE_NODES"); do echo "node$i"; done; fi
"""
)


def _stubs(tmp: Path) -> Path:
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    for name, text in (("srun", SRUN), ("scontrol", SCONTROL), ("torchrun", STUB), ("mrl", STUB)):
        f = bin_dir / name
        f.write_text(text)
        f.chmod(f.stat().st_mode | stat.S_IEXEC)
    return bin_dir


def _render(tmp: Path, nodes: int, overrides: list[str]) -> str:
    model = tmp / "model"
    model.mkdir(exist_ok=True)
    config = tmp / "run.yaml"
    config.write_text(f"run_name: r\noutput_dir: {tmp}\nmodel:\n  hf_path: {model}\n")
    over = [f"slurm.nodes={nodes}", f"slurm.cli={tmp / 'bin' / 'mrl'}", *overrides]
    cfg, slurm = load_with_slurm(str(config), over)
    return render_sbatch(cfg, slurm, str(config), [])


def _run(tmp: Path, script: str, nodes: int, job_id: int = 123) -> list[dict]:
    log = tmp / "calls.jsonl"
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    env |= {"PATH": f"{tmp / 'bin'}:{env['PATH']}", "STUB_LOG": str(log),
            "FAKE_NODES": str(nodes), "FAKE_STEP_GPUS": STEP_GPUS, "SLURM_JOB_ID": str(job_id),
            "SLURM_JOB_NODELIST": "x"}  # fmt: skip
    (tmp / "job.sh").write_text(script)
    out = subprocess.run(["bash", str(tmp / "job.sh")], env=env, capture_output=True, text=True,
                         timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    return [json.loads(line) for line in log.read_text().splitlines()]


def _steps(calls: list[dict]) -> list[dict]:
    """What the job ran besides srun/scontrol themselves: the CLI and torchrun."""
    return [c for c in calls if c["tool"] in ("mrl", "torchrun")]


CONTAINER = ["slurm.container_image=nvcr.io/x/y:1", "slurm.container_mounts=/data:/data"]


def test_colocated_job_binds_the_gpus_the_step_sees_and_runs_every_step_in_the_container(
    tmp_path: Path,
) -> None:
    _stubs(tmp_path)
    script = _render(
        tmp_path, 1,
        ["slurm.gpus_per_node=8", "slurm.servers_per_node=2", "slurm.gpus_per_server=2",
         *CONTAINER],
    )  # fmt: skip
    calls = _run(tmp_path, script, nodes=1)
    srun_calls = [c for c in calls if c["tool"] == "srun"]
    assert len(srun_calls) == 3  # the fleet, the wait for its servers, the trainer
    assert all("--container-image=nvcr.io/x/y:1" in c["argv"] for c in srun_calls)
    steps = _steps(calls)
    assert len(steps) == 3 and all(s["container"] == "1" for s in steps)  # all in the container
    fleet = next(s for s in steps if "--num-servers" in s["argv"])
    trainer = next(s for s in steps if s["tool"] == "torchrun")
    # servers: the step's last four devices; trainer: its first four (not 4-7 / 0-3)
    assert fleet["cvd"] == "10,11,14,15" and trainer["cvd"] == "3,5,6,7"
    os.environ["CUDA_VISIBLE_DEVICES"] = fleet["cvd"]  # what the fleet process sees
    try:
        assert assign_gpus(2, 2) == [["10", "11"], ["14", "15"]]
    finally:
        del os.environ["CUDA_VISIBLE_DEVICES"]
    wait = next(s for s in steps if "--wait-workers" in s["argv"])
    assert wait["argv"][wait["argv"].index("--wait-workers") + 1] == "2"


def test_disaggregated_job_gives_every_server_its_gpus_and_its_own_seed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _stubs(tmp_path)
    script = _render(
        tmp_path, 4,
        ["slurm.gpus_per_node=8", "slurm.servers_per_node=2", "slurm.gpus_per_server=4",
         *CONTAINER],
    )  # fmt: skip
    calls = _run(tmp_path, script, nodes=4)
    steps = _steps(calls)
    assert len(steps) == 4 and all(s["container"] == "1" for s in steps)
    fleets = [s for s in steps if "--num-servers" in s["argv"]]
    assert len(fleets) == 2 and all(f["cvd"] == STEP_GPUS for f in fleets)
    trainer = next(s for s in steps if s["tool"] == "torchrun")
    assert trainer["cvd"] == STEP_GPUS  # trainer nodes keep all their devices
    # each rollout node's fleet as `serve --engine sglang` builds it (SGLang not installed:
    # an empty package stands in for the import check only; nothing of it runs)
    fake = tmp_path / "fake"
    (fake / "sglang").mkdir(parents=True)
    (fake / "sglang" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(fake))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", STEP_GPUS)
    seeds, gpus = [], []
    for f in fleets:
        argv = f["argv"]
        assert argv[argv.index("--engine") + 1] == "sglang"
        parser = argparse.ArgumentParser()
        serve.add_arguments(parser)
        args = parser.parse_args(argv[1:] + ["--run-dir", str(tmp_path / "fleet")])
        from megatron_rl.config import load_config

        fleet = serve.build_fleet(args, "sglang", load_config(args.config, []))
        for p in fleet.servers:
            cmd = fleet.server_cmd(p)
            seeds.append(int(cmd[cmd.index("--random-seed") + 1]))
            gpus.append(p.gpus)
    assert len(set(seeds)) == 4, seeds  # every server of the job has its own seed
    assert gpus == [["3", "5", "6", "7"], ["10", "11", "14", "15"]] * 2


def test_ports_never_collide_for_any_job_id(tmp_path: Path) -> None:
    _stubs(tmp_path)
    script = _render(tmp_path, 1, ["slurm.gpus_per_node=0", "slurm.gpus_per_server=0",
                                   "slurm.server_engine=hf"])  # fmt: skip
    lines = [ln for ln in script.splitlines() if re.match(r"(RDZV|WEIGHT)_PORT=", ln)]
    assert len(lines) == 2
    router = int(re.search(r"ROUTER_PORT=(\d+)", script).group(1))  # type: ignore[union-attr]
    body = "\n".join(lines)
    loop = f'for SLURM_JOB_ID in $(seq 0 499); do\n{body}\necho "$RDZV_PORT $WEIGHT_PORT"; done'
    out = subprocess.run(["bash", "-c", loop], capture_output=True, text=True, timeout=30)
    pairs = [tuple(map(int, ln.split())) for ln in out.stdout.split("\n") if ln]
    assert len(pairs) == 500
    for rdzv, weight in pairs:  # the fixed ports of one job, on the first trainer node
        assert len({rdzv, weight, router}) == 3
        assert max(rdzv, weight) < 32768  # below Linux's ephemeral range (servers' free ports)
    # the trainer passes the job's weight port to the group it hosts
    assert 'rollout.sglang.master_port="$WEIGHT_PORT"' in script


def test_a_router_port_inside_the_job_ports_is_refused(tmp_path: Path) -> None:
    _stubs(tmp_path)
    with pytest.raises(ValueError, match="slurm.router_port=29600 falls in 29400-29899"):
        _render(tmp_path, 1, ["slurm.router_port=29600"])
