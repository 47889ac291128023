"""What `megatron-rl submit` renders and `megatron-rl serve` starts, checked without Slurm.

* the rendered serve command starts servers (``--engine hf`` on one CPU node), and with
  ``--engine sglang`` builds SGLang's own flags, never ``--config <run yaml>``;
* misconfigurations fail at once with one line naming the keys, and write nothing;
* torchrun forwards Slurm's USR1 to every worker (a real process tree: torchrun + 2 gloo ranks),
  which agree on the step to checkpoint.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launch.commands.submit import TORCHRUN_SIGNALS, load_with_slurm, render_sbatch
from launch.server_args import sglang_server_args
from launch.servers import Fleet, free_port, http
from megatron_rl.config import load_config

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "configs" / "demo_cpu.yaml"


def _cli(*args: str, cwd: Path = REPO, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "launch.cli", *args],
        capture_output=True, text=True, timeout=timeout, cwd=cwd,
    )  # fmt: skip


def _render_4_nodes(tmp: Path, *extra: str) -> str:
    out = _cli("submit", str(DEMO), "--nodes", "4", "--dry-run", f"output_dir={tmp}", *extra)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_rendered_serve_command_starts_servers_on_one_cpu_node(tmp_path: Path) -> None:
    script = _render_4_nodes(tmp_path, "slurm.servers_per_node=2")
    assert "--engine sglang" in script and "--cpus-per-task=" in script
    assert script.count('--cpus-per-task="$STEP_CPUS"') == 2  # fleet steps and trainer step
    keep = ("RUN_DIR=", "CONFIG=", "SERVER_MODEL=", "HEALTH_TIMEOUT=", "MRL=",
            "SERVERS_PER_NODE=", "GPUS_PER_SERVER=")  # fmt: skip
    lines = [ln for ln in script.splitlines() if ln.startswith(keep)]
    serve = re.search(r"\n\s+(\$MRL serve --model .*?)&\n", script, re.S)
    assert serve is not None
    command = serve.group(1).replace("--engine sglang", "--engine hf")
    port = free_port()
    lines += [f"MRL='{sys.executable} -m launch.cli'", f'ROUTER_ARG=(--router-port {port})', "i=0",
              'mkdir -p "$RUN_DIR"', "exec " + command]  # fmt: skip
    proc = subprocess.Popen(["bash", "-c", "\n".join(lines)], cwd=REPO, start_new_session=True)
    try:
        deadline = time.monotonic() + 400
        healthy: list = []
        while time.monotonic() < deadline and len(healthy) < 2:
            assert proc.poll() is None, "the rendered serve command exited"
            status, text = http("GET", f"http://127.0.0.1:{port}/workers")
            healthy = json.loads(text).get("workers", []) if status == 200 else []
            time.sleep(1)
        assert len(healthy) == 2
        manifest = json.loads(next((tmp_path / "demo_cpu").glob("servers-*.json")).read_text())
        cmds = [p["cmd"] for p in manifest["processes"] if p["role"] == "server"]
        assert all("--engine" in c and c[c.index("--engine") + 1] == "hf" for c in cmds)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)


def test_sglang_servers_get_sglang_flags_not_the_run_config(tmp_path: Path) -> None:
    cfg = load_config(DEMO, ["rollout.dtype=bfloat16", "rollout.max_batch=96"])
    args = sglang_server_args(cfg.rollout)
    fleet = Fleet(tmp_path, "/m", 2, engine="sglang", gpus_per_server=2, gpu_ids=[0, 1, 2, 3],
                  router_url="http://r:1", sglang_args=args, seed=5)  # fmt: skip
    cmd = fleet.server_cmd(fleet.servers[1])
    assert cmd[1:3] == ["-m", "sglang.launch_server"] and "--config" not in cmd
    flags = dict(zip(cmd[3::2], cmd[4::2], strict=False))
    assert flags["--tp-size"] == "2" and flags["--dtype"] == "bfloat16"
    assert flags["--max-running-requests"] == "96" and flags["--random-seed"] == "6"  # 5 + 1
    assert fleet.servers[1].gpus == ["2", "3"]


def test_serve_engine_sglang_without_sglang_fails_with_one_line(tmp_path: Path) -> None:
    out = _cli("serve", "--model", str(REPO / "models" / "tiny-base"), "--num-servers", "1",
               "--engine", "sglang", "--router-port", str(free_port()), "--run-dir",
               str(tmp_path / "run"))  # fmt: skip
    assert out.returncode == 2
    err = out.stderr.strip().splitlines()
    assert len(err) == 1 and "sglang package is not installed" in err[0], out.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("overrides", "keys"),
    [
        (["slurm.gpus_per_server=4", "rollout.sglang.engine_tp=2"],
         ["rollout.sglang.engine_tp=2", "slurm.gpus_per_server=4"]),
        (["slurm.server_engine=hf", "slurm.gpus_per_server=0", "slurm.gpus_per_node=0",
          "rollout.sglang.engine_tp=2"], ["rollout.sglang.engine_tp=2", "slurm.gpus_per_server"]),
        (["rollout.sglang.weight_sync=distributed"],
         ["rollout.sglang.weight_sync=distributed", "rollout.sync_mode"]),
    ],
)  # fmt: skip
def test_submit_refuses_disagreeing_keys_in_one_line(
    tmp_path: Path, overrides: list[str], keys: list[str]
) -> None:
    out = _cli("submit", str(DEMO), "--dry-run", f"output_dir={tmp_path}/runs", *overrides)
    assert out.returncode == 2 and out.stdout == ""
    err = out.stderr.strip().splitlines()
    assert len(err) == 1 and all(k in err[0] for k in keys), out.stderr
    assert not (tmp_path / "runs").exists()


def test_train_refuses_distributed_weight_sync_with_disk_sync(tmp_path: Path) -> None:
    out = _cli("train", str(DEMO), f"output_dir={tmp_path}", "rollout.engine=sglang",
               "rollout.urls=[http://127.0.0.1:9]", "rollout.sglang.weight_sync=distributed",
               "rollout.sync_mode=disk")  # fmt: skip
    assert out.returncode == 2
    err = out.stderr.strip().splitlines()
    assert len(err) == 1 and "rollout.sync_mode=memory" in err[0], out.stderr
    assert list(tmp_path.iterdir()) == []


def test_engine_tp_follows_gpus_per_server_in_the_train_command(tmp_path: Path) -> None:
    cfg, slurm = load_with_slurm(str(DEMO), ["slurm.nodes=2", "slurm.gpus_per_server=4"])
    script = render_sbatch(cfg, slurm, str(DEMO), [])
    assert "rollout.sglang.engine_tp=4" in script


def test_submit_loads_an_old_eval_key_onto_the_new_one() -> None:
    cfg, _ = load_with_slurm(str(DEMO), ["slurm.nodes=2", "rl.eval_every=0"])
    assert cfg.eval.every == 0
    with pytest.raises(ValueError, match="disagree"):
        load_with_slurm(str(DEMO), ["rl.eval_every=0", "eval.every=1"])


def test_master_addr_is_not_gethostbyname_of_the_hostname(monkeypatch: pytest.MonkeyPatch):
    from megatron_rl.rollout.config import SGLangConfig
    from megatron_rl.rollout.sglang_weights import DistributedWeightSync

    real = socket.gethostbyname
    monkeypatch.setattr(socket, "gethostname", lambda: "node17")
    monkeypatch.setattr(
        socket, "gethostbyname", lambda h: "127.0.1.1" if h == "node17" else real(h)
    )
    sync = DistributedWeightSync(SGLangConfig(), lambda *a: None, lambda: [],
                                 router_url="http://127.0.0.1:30000")  # fmt: skip
    assert sync.addr == "127.0.0.1"


def test_gpu_machines_default_to_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    cfg = load_config(DEMO)
    assert cfg.model.dtype == "bfloat16" and cfg.rollout.dtype == "bfloat16"
    assert load_config(DEMO, ["model.dtype=float32"]).model.dtype == "float32"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert load_config(DEMO).model.dtype == "float32"


WORKER = r"""
import os, sys, time, json
import torch, torch.distributed as dist
from megatron_rl.train.preemption import PreemptionFlag
dist.init_process_group("gloo")
rank, out = dist.get_rank(), sys.argv[1]
stop = PreemptionFlag()
open(f"{out}/ready-{rank}", "w").write(str(os.getpid()))
for step in range(10_000):
    time.sleep(0.2 + 0.3 * rank)  # ranks reach the check at different times
    flag = torch.tensor([int(stop.requested)])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)  # the loop's agreement across ranks
    if flag.item():
        json.dump({"step": step, "rank": rank}, open(f"{out}/ckpt-{rank}.json", "w"))
        sys.exit(3)
"""


@pytest.mark.parametrize("forward", [True, False])
def test_usr1_reaches_torchrun_workers_and_they_checkpoint_one_step(
    tmp_path: Path, forward: bool
) -> None:
    """USR1 to torchrun, as the sbatch script's trap sends it: with the rendered
    ``--signals-to-handle`` every worker gets it and (agreeing as the RL loop does) checkpoints
    the same step; without it (torchrun's
    default), torchrun dies and no worker writes a checkpoint (the bug this fixes)."""
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    flags = [f"--signals-to-handle={TORCHRUN_SIGNALS}", "--shutdown-timeout=60"] if forward else []
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", "--standalone",
         *flags, str(worker), str(tmp_path)], env=env, start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while len(list(tmp_path.glob("ready-*"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1.0)
    os.kill(proc.pid, signal.SIGUSR1)
    rc = proc.wait(120)
    ckpts = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("ckpt-*.json"))]
    if forward:
        assert rc != 0 and [c["rank"] for c in ckpts] == [0, 1]
        assert ckpts[0]["step"] == ckpts[1]["step"]
    else:
        assert ckpts == []
        # orphaned workers, if any (torchrun starts each in its own session: killpg misses them)
        for pid in [proc.pid, *(int(p.read_text()) for p in tmp_path.glob("ready-*"))]:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
