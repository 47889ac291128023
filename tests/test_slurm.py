"""Slurm launch on a real single-node cluster (munged + slurmctld + slurmd from Debian packages).

The job script is the one ``megatron-rl submit`` renders; it starts the rollout fleet
(``megatron-rl serve --num-servers``: embedded ``hf`` servers + sglang-router) as a job step and
the trainer as another. The trainer here is a small stand-in (``FAKE_TRAINER`` below) that uses
the production ``sglang`` engine against the router, "trains" by sleeping, syncs weights through
the servers and checkpoints its step; it has the real trainer's resume and preemption contract
(SIGUSR1/SIGTERM -> checkpoint at the end of the step, exit non-zero). It stands in for
``megatron-rl train`` only to keep these tests within ~3 minutes on 2 busy cores.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launch.commands.submit import load_with_slurm, render_sbatch
from launch.servers import free_port
from megatron_rl.rollout.tiny_model import make_tiny_qwen2

sys.path.insert(0, str(Path(__file__).parent))
from slurm_cluster import SlurmCluster, slurm_available  # noqa: E402

REPO = Path(__file__).resolve().parents[1]

FAKE_TRAINER = r"""
import json, os, signal, sys, time
from pathlib import Path
from megatron_rl.rollout.base import GenRequest, SamplingParams
from megatron_rl.rollout.config import RolloutConfig, SGLangConfig
from megatron_rl.rollout.sglang_client import SGLangEngine

run_dir, router, model = Path(sys.argv[1]), sys.argv[2], sys.argv[5]
steps, step_s = int(sys.argv[3]), float(sys.argv[4])
stop = []
for sig in (signal.SIGUSR1, signal.SIGTERM):
    signal.signal(sig, lambda *a: stop.append(1))
ckpt = run_dir / "checkpoint" / "latest.json"
start = json.loads(ckpt.read_text())["step"] + 1 if ckpt.exists() else 0
cfg = RolloutConfig(engine="sglang", urls=[router], sync_dir=str(run_dir / "rollout_weights"),
                    sglang=SGLangConfig(health_timeout_s=60))
engine = SGLangEngine(cfg, model, seed=0)
for step in range(start, steps):
    groups = engine.generate([GenRequest([5, 6, 7], SamplingParams(max_tokens=4, n=2, seed=step))])
    time.sleep(step_s)
    sync_s = engine.update_weights_from_disk(model)
    row = {"step": step, "restart": int(os.environ.get("SLURM_RESTART_COUNT", 0)),
           "samples": sum(len(g) for g in groups), "sync_s": sync_s, **engine.metrics}
    with open(run_dir / "metrics.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")
    ckpt.parent.mkdir(exist_ok=True)
    (ckpt.parent / "tmp.json").write_text(json.dumps({"step": step}))
    (ckpt.parent / "tmp.json").replace(ckpt)
    if stop:
        print(f"signal: checkpointed step {step}, exiting", flush=True)
        engine.shutdown()
        sys.exit(3)
engine.shutdown()
"""


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


def _render_fake(tmp: Path, steps: int, step_s: float, servers: int) -> Path:
    model = make_tiny_qwen2(tmp / "model", seed=0)
    config = tmp / "run.yaml"
    config.write_text(f"run_name: job\noutput_dir: {tmp / 'runs'}\nmodel:\n  hf_path: {model}\n")
    fake = tmp / "fake_trainer.py"
    fake.write_text(FAKE_TRAINER)
    train = f"{sys.executable} {fake} $RUN_DIR $ROUTER_URL {steps} {step_s} {model}"
    return _write_script(tmp, config, [*_slurm_overrides(servers), f"slurm.train_command={train}"])


def _metrics(run_dir: Path) -> list[dict]:
    f = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in f.read_text().splitlines()] if f.exists() else []


def test_sbatch_tiny_rl_job_uses_router_and_servers(cluster: SlurmCluster, tmp_path: Path) -> None:
    """The real `megatron-rl train` (micro config) behind the rendered script."""
    model = make_tiny_qwen2(tmp_path / "model", "test", seed=0)
    rows = [
        {"prompt": f"Say something about {w}. #{i}", "gold": "a", "verifier": "regex",
         "pattern": "[\\s\\S]*[a-m][\\s\\S]*"}
        for i, w in enumerate(["cats", "dogs", "rain", "sun", "tea", "maps", "jazz", "snow"] * 2)
    ]  # fmt: skip
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(r) + "\n" for r in rows))
    micro = [
        f"output_dir={tmp_path / 'runs'}", "run_name=job", f"model.hf_path={model}",
        f"domains.task_files=[{tasks}]", "domains.include=['tasks/*']", "train.steps=2",
        "train.threads=1", "train.lr=0.01", "rl.prompts_per_step=4", "rl.group_size=4",
        "rl.eval_samples_per_domain=4", "rl.eval_every=0", "rollout.max_new_tokens=8",
        "tracking.wandb=disabled", "tracking.progress=false", "checkpoint.every=1",
        "domains.exclude=[]", "scheduler.filter_zero_variance=false", "scheduler.oversample=1.0",
    ]  # fmt: skip
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


def test_requeue_mid_run_resumes_without_repeating_or_skipping(
    cluster: SlurmCluster, tmp_path: Path
) -> None:
    steps = 5
    script = _render_fake(tmp_path, steps=steps, step_s=0.7, servers=1)
    job = cluster.sbatch(script, env={"PYTHONPATH": str(REPO)})
    run_dir = tmp_path / "runs" / "job"
    deadline = time.monotonic() + 240
    while len(_metrics(run_dir)) < 2 and time.monotonic() < deadline:
        assert cluster.job_state(job) in ("PENDING", "RUNNING"), cluster.job_state(job)
        time.sleep(0.3)
    # What Slurm sends signal_before_end_s before the time limit: USR1 to the batch shell.
    cluster.run(["scancel", "--signal=USR1", "--batch", str(job)])
    deadline = time.monotonic() + 60
    while cluster.job_state(job) != "PENDING" and time.monotonic() < deadline:
        time.sleep(0.3)
    # Slurm holds a requeued job back (BeginTime ~2 min later); let it start again now.
    cluster.run(["scontrol", "update", f"jobid={job}", "StartTime=now"])
    state = cluster.wait_job(job, timeout_s=300)
    out = (run_dir / f"slurm-{job}.out").read_text()
    assert state == "COMPLETED", out
    rows = _metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(steps)), rows
    restarts = [r["restart"] for r in rows]
    assert restarts[0] == 0 and restarts[-1] == 1 and restarts == sorted(restarts)
    assert "requeueing job" in out and "restart count 1" in out


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
        '--nproc-per-node="$TRAINER_GPUS"',
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
