"""Slurm launch on a real single-node cluster (munged + slurmctld + slurmd from Debian packages).

Every job here is the script ``megatron-rl submit`` renders, running the real ``megatron-rl
train`` (no stand-in trainer): the rollout fleet (``megatron-rl serve --num-servers``: embedded
``hf`` servers behind the real sglang-router) is one job step, the trainer another. The runs are
micro-sized (a random tiny Qwen2, 16 samples a step) so the whole file takes minutes on 2 cores.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TypeVar

import pytest

from benchmarks.tiny_model import make_tiny_qwen2
from launch.commands.submit import load_with_slurm, render_sbatch
from launch.servers import free_port

sys.path.insert(0, str(Path(__file__).parent))
from slurm_cluster import SlurmCluster, slurm_available

REPO = Path(__file__).resolve().parents[2]
T = TypeVar("T")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    why = slurm_available()
    if why:
        pytest.skip(why)
    with SlurmCluster(tmp_path_factory.mktemp("slurm")) as c:
        yield c


def _slurm_overrides(servers: int) -> list[str]:
    """A CPU layout: embedded hf servers, no GPUs, the CLI run by this interpreter."""
    return [
        "rl.off_policy=false",  # the demo overlaps; the job's assertions are on-policy
        "slurm.gpus_per_node=0",
        "slurm.gpus_per_server=0",
        "slurm.server_engine=hf",
        f"slurm.servers_per_node={servers}",
        f"slurm.router_port={free_port()}",
        "slurm.health_timeout_s=240",
        "slurm.time_limit=00:20:00",
        f"slurm.cli={sys.executable} -m launch.cli",
    ]


def _write_script(tmp: Path, config: Path, overrides: list[str]) -> Path:
    cfg, slurm = load_with_slurm(str(config), overrides)
    Path(cfg.output_dir, cfg.run_name).mkdir(parents=True)  # sbatch --output needs it
    script = tmp / "job.sbatch"
    train = [o for o in overrides if not o.startswith("slurm.")]
    script.write_text(render_sbatch(cfg, slurm, str(config), train))
    return script


def _micro(tmp_path: Path, steps: int) -> list[str]:
    """A tiny real RL run: a random tiny Qwen2, 16 regex tasks, 4 prompts x 4 samples a step."""
    model = make_tiny_qwen2(tmp_path / "model", "test", seed=0)
    rows = [
        {"prompt": f"Say something about {w}. #{i}", "gold": "a", "verifier": "regex",
         "pattern": "[\\s\\S]*[a-m][\\s\\S]*"}
        for i, w in enumerate(["cats", "dogs", "rain", "sun", "tea", "maps", "jazz", "snow"] * 2)
    ]  # fmt: skip
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return [
        f"output_dir={tmp_path / 'runs'}", "run_name=job", f"model.hf_path={model}",
        f"domains.task_files=[{tasks}]", "domains.include=['tasks/*']", f"train.steps={steps}",
        "train.threads=1", "train.lr=0.01", "rl.prompts_per_step=4", "rl.group_size=4",
        "eval.samples_per_domain=4", "eval.every=0", "rollout.max_new_tokens=8",
        "tracking.wandb=disabled", "tracking.progress=false", "checkpoint.every=1",
        "domains.exclude=[]", "scheduler.filter_zero_variance=false", "scheduler.oversample=1.0",
    ]  # fmt: skip


def _metrics(run_dir: Path) -> list[dict]:
    f = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in f.read_text().splitlines()] if f.exists() else []


def test_sbatch_tiny_rl_job_uses_router_and_servers(cluster: SlurmCluster, tmp_path: Path) -> None:
    """The real `megatron-rl train` (micro config) behind the rendered script."""
    micro = _micro(tmp_path, steps=2)
    script = _write_script(
        tmp_path, REPO / "configs" / "demo_cpu.yaml", [*micro, *_slurm_overrides(2)]
    )
    job = cluster.sbatch(script, env={"PYTHONPATH": str(REPO)})
    state = cluster.wait_job(job, timeout_s=400)
    run_dir = tmp_path / "runs" / "job"
    out = (run_dir / f"slurm-{job}.out").read_text()
    assert state == "COMPLETED", out
    steps = [r for r in _metrics(run_dir) if "rollout/samples" in r]
    assert [r["step"] for r in steps] == [0, 1]
    assert all(r["rollout/samples"] == 16 for r in steps)
    assert all(
        r["mismatch/logp_abs_max"] < 1e-3 for r in steps
    )  # servers got the trainer's weights
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 2
    assert (run_dir / "checkpoints").is_dir() and any((run_dir / "checkpoints").iterdir())
    manifest = json.loads(next(run_dir.glob("servers-*.json")).read_text())
    assert [p["role"] for p in manifest["processes"]] == ["router", "server", "server"]
    for p in manifest["processes"][1:]:  # the router spread the trainer's requests over both
        assert Path(p["log"]).read_text().count("POST /generate") >= 1, p["name"]
    weights = json.loads((run_dir / "rollout_weights" / "current_weights.json").read_text())
    assert int(weights["version"]) == 3  # initial push + one sync per step
    assert "trainer exited with code 0" in out


def _submit(cluster: SlurmCluster, overrides: list[str]) -> int:
    """``megatron-rl submit demo_cpu.yaml --nodes 1 ...``: renders the script and calls sbatch."""
    out = subprocess.run(
        [sys.executable, "-m", "launch.cli", "submit", str(REPO / "configs" / "demo_cpu.yaml"),
         "--nodes", "1", *overrides],
        env=cluster.env() | {"PYTHONPATH": str(REPO)}, capture_output=True, text=True,
        timeout=120, cwd=REPO,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return int(out.stdout.split("submitted job ")[1].split()[0])


def _wait_rows(cluster: SlurmCluster, job: int, run_dir: Path, step: int, timeout_s: float) -> None:
    """Until metrics.jsonl holds the training row of ``step`` (not the start-up eval's, which
    is logged at step 0 too); the job must keep running meanwhile."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(r.get("step") == step and "rollout/samples" in r for r in _metrics(run_dir)):
            return
        state = cluster.job_state(job)
        assert state in ("PENDING", "RUNNING", "REQUEUED"), (state, _out(run_dir, job))
        time.sleep(0.5)
    raise AssertionError(f"no metrics row for step {step}:\n{_out(run_dir, job)}")


def _out(run_dir: Path, job: int) -> str:
    f = run_dir / f"slurm-{job}.out"
    return f.read_text(errors="replace")[-6000:] if f.exists() else "(no output yet)"


def _wait_out(
    run_dir: Path, job: int, find: Callable[[str], T | None], what: str, timeout_s: float
) -> T:
    """Poll the job's whole output until ``find`` returns something; fail naming ``what``."""
    deadline = time.monotonic() + timeout_s
    f = run_dir / f"slurm-{job}.out"
    while time.monotonic() < deadline:
        if (found := find(f.read_text(errors="replace") if f.exists() else "")) is not None:
            return found
        time.sleep(0.2)
    raise AssertionError(f"{what} never came in job {job}:\n{_out(run_dir, job)}")


def _wait_text(run_dir: Path, job: int, text: str, timeout_s: float) -> None:
    """Until the job's output holds ``text``."""
    _wait_out(run_dir, job, lambda out: True if text in out else None, repr(text), timeout_s)


def _wait_resume(run_dir: Path, job: int, restart: int, timeout_s: float) -> int:
    """The step the ``restart``-th run of the job resumed at (from its "next step K" log line)."""

    def find(out: str) -> int | None:
        after = out.partition(f"restart count {restart}")[2]
        found = re.findall(r"resuming rl run from .* \(next step (\d+)\)", after)
        return int(found[0]) if found else None

    return _wait_out(run_dir, job, find, f"the resume of run {restart}", timeout_s)


def _trainer_pids(marker: str) -> list[int]:
    """The trainer ranks of a job (and their forks): ``megatron-rl train`` processes whose
    command line holds ``marker``. Not torchrun or srun: they must stay awake to forward."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:  # not a process, or gone
            continue
        if "train" not in argv or not any(marker in a for a in argv):
            continue
        if not any("torchrun" in a or a.endswith("srun") for a in argv):
            pids.append(int(proc.name))
    return pids


@contextmanager
def _frozen(marker: str) -> Iterator[None]:
    """SIGSTOP the job's trainer ranks for the block, SIGCONT after: signals sent meanwhile
    are pending when they wake, whatever the speed of a step."""
    deadline = time.monotonic() + 300  # waits only as long as it must; under load, minutes
    while not (pids := _trainer_pids(marker)):
        assert time.monotonic() < deadline, "no trainer process to freeze"
        time.sleep(0.1)
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


def _restart_now(cluster: SlurmCluster, job: int) -> None:
    """Slurm holds a requeued job back (BeginTime ~2 min later); let it start again now."""
    deadline = time.monotonic() + 300
    while cluster.job_state(job) not in ("PENDING",) and time.monotonic() < deadline:
        time.sleep(0.3)
    cluster.run(["scontrol", "update", f"jobid={job}", "StartTime=now"])


def test_rendered_job_distributed_sync_survives_server_kill_requeue_and_usr1(
    cluster: SlurmCluster, tmp_path: Path
) -> None:
    """The rendered job, 6 RL steps with ``weight_sync=distributed`` over gloo, 2 trainer
    ranks under torchrun (data parallel; rank 0 is the one rollout controller): a server is
    killed after step 0 (the fleet restarts it, it loads the current weights, the group is
    rebuilt with it); ``scontrol requeue`` after step 2 (the job resumes from the checkpoint);
    USR1 (Slurm's time-limit warning) after step 3: the trainer checkpoints, the script
    requeues, the job continues from that checkpoint. Each step is logged once, no sample is
    lost, and the servers' log-probs match the trainer's throughout."""
    steps = 9
    overrides = [
        *_micro(tmp_path, steps), *_slurm_overrides(2), "rollout.sync_mode=memory",
        "rollout.sglang.weight_sync=distributed", f"rollout.sglang.master_port={free_port()}",
        "rollout.sglang.group_timeout_s=300", "rollout.sglang.retry_backoff_s=0.5",
        "slurm.trainer_procs_per_node=2",  # torchrun, 2 gloo ranks (dp=2), rank 0 controls
    ]  # fmt: skip
    job = _submit(cluster, overrides)
    run_dir = tmp_path / "runs" / "job"

    _wait_rows(cluster, job, run_dir, 0, 400)
    manifest = next(run_dir.glob("servers-*.json"))
    victim = json.loads(manifest.read_text())["processes"][1]
    # frozen until the fleet has restarted it: a broadcast into a group with a dead member leaves
    # the survivor waiting out group_timeout_s; here the next sync sees the new member instead
    with _frozen(str(tmp_path)):
        subprocess.run(["kill", "-9", str(victim["pid"])], check=True)
        deadline = time.monotonic() + 300
        while json.loads(manifest.read_text())["processes"][1]["pid"] == victim["pid"]:
            assert time.monotonic() < deadline, "the fleet did not restart the killed server"
            time.sleep(0.2)

    # a micro step takes ~0.5 s on an idle machine: the ranks are frozen while a signal is on
    # its way (poll, scontrol, the script's trap, srun, torchrun), so it lands mid-run
    _wait_rows(cluster, job, run_dir, 2, 400)
    with _frozen(str(tmp_path)):
        cluster.run(["scontrol", "requeue", str(job)])
    _restart_now(cluster, job)

    resumed = _wait_resume(run_dir, job, restart=1, timeout_s=500)
    with _frozen(str(tmp_path)):
        cluster.run(["scancel", "--signal=USR1", "--batch", str(job)])
        _wait_text(run_dir, job, "closing signal SIGUSR1", 300)  # pending on the frozen ranks
    _restart_now(cluster, job)

    state = cluster.wait_job(job, timeout_s=500)
    out = (run_dir / f"slurm-{job}.out").read_text(errors="replace")
    assert state == "COMPLETED", out[-6000:]
    rows = [r for r in _metrics(run_dir) if "rollout/samples" in r]
    assert [r["step"] for r in rows] == list(range(steps)), [r["step"] for r in rows]
    assert all(r["rollout/samples"] == 16 for r in rows)  # no sample lost to the kill
    worst = max(r["mismatch/logp_abs_max"] for r in rows)
    assert worst < 1e-3, [r["mismatch/logp_abs_max"] for r in rows]
    assert "restart count 2" in out and "USR1: asking the trainer" in out
    script = (run_dir / "job.sbatch").read_text()
    assert "TRAINER_PROCS=2" in script and "torchrun" in script
    # torchrun forwarded USR1 to both ranks (to each worker's process group: children of the
    # controller that inherited its handler may log it too)
    assert "Received 10 death signal, shutting down workers" in out
    assert out.count("received signal 10: will checkpoint after this step") >= 2
    preempted = int(re.findall(r"preemption signal received: checkpointed step (\d+)", out)[-1])
    # USR1 came mid-run, in the resumed run's first step or the next: steps were still to do
    assert resumed <= preempted <= resumed + 1 < steps - 1, (resumed, preempted)
    assert f"(next step {preempted + 1})" in out  # the requeued job continued from it
    assert "requeueing job" in out and "trainer exited with code 0" in out
    assert "rebuilding" in out or "weight-update group" in out
    restarted = json.loads(next(run_dir.glob("servers-*.json")).read_text())
    assert sum(p["restarts"] for p in restarted["processes"]) == 0  # a fresh fleet after requeue
    fleet_logs = "".join(p.read_text(errors="replace") for p in (run_dir / "logs").glob("fleet-*"))
    assert "died with code" in fleet_logs and "before rejoining" in fleet_logs


def test_submit_dry_run_prints_a_4_node_disaggregated_script(tmp_path: Path) -> None:
    config = tmp_path / "run.yaml"
    config.write_text(f"run_name: big\noutput_dir: {tmp_path}\nmodel:\n  hf_path: {tmp_path}\n")
    out = subprocess.run(
        [sys.executable, "-m", "launch.cli", "submit", str(config), "--nodes", "4", "--dry-run",
         "slurm.partition=gpu", "slurm.account=proj7", "slurm.container_image=nvcr.io/x/y:1",
         "slurm.network_interface=ib0", "slurm.servers_per_node=2", "slurm.gpus_per_server=4",
         "rl.group_size=8"],
        capture_output=True, text=True, timeout=120, cwd=REPO,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    s = out.stdout
    for line in (
        "#SBATCH --nodes=4",
        "#SBATCH --gpus-per-node=8",
        "#SBATCH --partition=gpu",
        "#SBATCH --account=proj7",
        "#SBATCH --requeue",
        "#SBATCH --signal=B:USR1@300",
        "TRAINER_NODE_COUNT=2",
        "ROLLOUT_NODE_COUNT=2",
        "SERVERS_PER_NODE=2",
        "export NCCL_SOCKET_IFNAME=ib0 GLOO_SOCKET_IFNAME=ib0",
        "--container-image=nvcr.io/x/y:1",
        '--nproc-per-node="$TRAINER_PROCS"',
        "--engine sglang",
        "rl.group_size=8",
        'scontrol requeue "$SLURM_JOB_ID"',
    ):
        assert line in s, line
    assert "{{" not in s and "{%" not in s
    check = subprocess.run(["bash", "-n"], input=s, capture_output=True, text=True, timeout=30)
    assert check.returncode == 0, check.stderr


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["slurm.servers_per_node=3", "slurm.gpus_per_server=4"], "12 GPUs per node"),
        (["slurm.gpus_per_server=8"], "leave none to the trainer"),
        (["slurm.nodes=2", "slurm.rollout_nodes=2"], "at least one of the 2 nodes"),
        (["slurm.time_limit=4h"], "HH:MM:SS"),
        (["slurm.bogus=1"], "unknown config key slurm.'bogus'"),
    ],
)
def test_submit_rejects_layouts_that_do_not_fit(
    tmp_path: Path, overrides: list[str], message: str
) -> None:
    config = tmp_path / "run.yaml"
    config.write_text(f"model:\n  hf_path: {tmp_path}\n")
    with pytest.raises(ValueError, match=message.replace("'", ".").replace("(", r"\(")):
        load_with_slurm(str(config), overrides)
