"""A rollout server dies in the middle of a distributed weight broadcast: one retry, not a stall.

Real processes throughout: the trainer is `megatron-rl train` under torchrun (2 gloo ranks,
rank 0 the controller), talking to the real sglang-router in front of two embedded servers
(`megatron-rl serve --engine hf`) that :class:`launch.servers.Fleet` supervises, with
``weight_sync: distributed`` (the group built as SGLang builds it, gloo instead of NCCL).

How the death is placed: server 0 runs through a wrapper that, on the second bucket of weight
version 3 (a training step's sync), exits at once, with rank 0 and the other server already in
that bucket's broadcast. Before the fix the survivor sat in the broken group until
``group_timeout_s``; now rank 0 aborts its end, leaves the dead member out, sends the version
again to the survivor, and the fleet's restart of the dead one catches up from the record.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

from launch.servers import Fleet, Proc, free_port
from megatron_rl.rollout.auth import API_KEY_ENV

REPO = Path(__file__).resolve().parents[2]

DYING_SERVER = textwrap.dedent(
    """
    # `megatron-rl serve`, except that it exits in the middle of one broadcast (test only)
    import os, sys
    from pathlib import Path
    from megatron_rl.rollout import server_weights

    mark = Path(sys.argv[1])
    real = server_weights.WeightReceiver.update_from_distributed
    seen = {}

    async def dying(self, request):
        body = await request.json()  # aiohttp keeps the body: the handler reads it again
        key = (body.get("group_name"), body.get("weight_version"))
        seen[key] = seen.get(key, 0) + 1
        if key[1] == "3" and seen[key] == 2 and not mark.exists():
            mark.write_text(str(os.getpid()))
            os._exit(9)  # rank 0 and the other server are in this bucket's broadcast now
        return await real(self, request)

    server_weights.WeightReceiver.update_from_distributed = dying
    from launch.cli import main
    sys.exit(main(sys.argv[2:]))
    """
)


class DyingFleet(Fleet):
    """Server 0 runs through :data:`DYING_SERVER`; the rest as usual."""

    wrapper: Path
    mark: Path

    def server_cmd(self, p: Proc) -> list[str]:
        cmd = super().server_cmd(p)
        if p is not self.servers[0]:
            return cmd
        return [sys.executable, str(self.wrapper), str(self.mark), *cmd[3:]]  # after -m launch.cli


def _micro(tmp: Path, steps: int) -> list[str]:
    from benchmarks.tiny_model import make_tiny_qwen2

    model = make_tiny_qwen2(tmp / "model", "test", seed=0)
    words = ["cats", "dogs", "rain", "sun", "tea", "maps", "jazz", "snow"] * 2  # 16 tasks
    rows = [{"prompt": f"Say something about {w}. #{i}", "gold": "a", "verifier": "regex",
             "pattern": "[\\s\\S]*[a-m][\\s\\S]*"} for i, w in enumerate(words)]  # fmt: skip
    tasks = tmp / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return [
        f"output_dir={tmp / 'runs'}", "run_name=job", f"model.hf_path={model}",
        f"domains.task_files=[{tasks}]", "domains.include=['tasks/*']", "domains.exclude=[]",
        f"train.steps={steps}", "train.threads=1", "train.lr=0.01", "rl.prompts_per_step=4",
        "rl.group_size=4", "eval.samples_per_domain=4", "eval.every=0",
        "rollout.max_new_tokens=8", "tracking.wandb=disabled", "tracking.progress=false",
        "checkpoint.every=0", "scheduler.filter_zero_variance=false", "scheduler.oversample=1.0",
        "rl.off_policy=false",  # on-policy: the mismatch compares the same weights on both sides
    ]  # fmt: skip


def _hold_until_restarted(proc: subprocess.Popen[str], fleet: Fleet, tmp: Path) -> None:
    """Once the death's sync is over (step 1 logged), freeze the trainer ranks until the fleet
    has restarted the dead server: the steps after it then run with both servers, whatever
    the speed of a step (a restart takes tens of seconds here, a micro step well under one)."""
    from test_slurm import _trainer_pids

    metrics = tmp / "runs" / "job" / "metrics.jsonl"
    deadline = time.monotonic() + 600

    def step1_logged() -> bool:
        rows = (
            [json.loads(ln) for ln in metrics.read_text().splitlines()] if metrics.exists() else []
        )
        return any(r.get("step") == 1 and "rollout/samples" in r for r in rows)

    while not (fleet.mark.exists() and step1_logged()):  # type: ignore[attr-defined]
        assert proc.poll() is None and time.monotonic() < deadline, "no death, or no step 1"
        time.sleep(0.05)
    ranks = [p for p in _trainer_pids(str(tmp)) if p != proc.pid]
    for pid in ranks:
        os.kill(pid, signal.SIGSTOP)
    try:
        while fleet.servers[0].restarts < 1:
            assert time.monotonic() < deadline, "the fleet did not restart the dead server"
            time.sleep(0.2)
    finally:
        for pid in ranks:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


def _supervise(fleet: Fleet, stop: threading.Event) -> None:
    while not stop.wait(0.3):
        fleet.check()


def test_server_death_mid_broadcast_costs_one_retry(tmp_path: Path) -> None:
    steps = 5
    micro = _micro(tmp_path, steps)
    fleet = DyingFleet(
        tmp_path / "fleet", str(tmp_path / "model"), 2, engine="hf", router_port=free_port(),
        health_timeout_s=240, sync_dir=str(tmp_path / "sync"),
        server_args=["rollout.sglang.bucket_timeout_s=10"],
    )  # fmt: skip
    # the dying server gets group rank 1 (members are sorted by URL): gloo's broadcast tree
    # sends to rank 1 first, so its death leaves rank 2 blocked in the receive (the stall)
    ports = sorted((free_port(), free_port()), key=str)
    fleet.servers[0].port, fleet.servers[1].port = ports
    fleet.wrapper, fleet.mark = tmp_path / "dying_server.py", tmp_path / "died"
    fleet.wrapper.write_text(DYING_SERVER)
    stop = threading.Event()
    with fleet:
        supervisor = threading.Thread(target=_supervise, args=(fleet, stop), daemon=True)
        supervisor.start()
        cmd = [
            sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
            "-m", "launch.cli", "train", str(REPO / "configs" / "demo_cpu.yaml"), *micro,
            "rollout.engine=sglang", f"rollout.urls=[{fleet.router_url}]",
            "rollout.sync_mode=memory", "rollout.sglang.weight_sync=distributed",
            f"rollout.sglang.master_port={free_port()}", "rollout.sglang.bucket_mb=1",
            "rollout.sglang.bucket_timeout_s=10",
            "rollout.sglang.group_timeout_s=60", f"rollout.sync_dir={tmp_path / 'sync'}",
        ]  # fmt: skip
        env = {"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
        env |= {k: v for k, v in os.environ.items() if k in ("PYTHONPATH", API_KEY_ENV)}
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, text=True, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT)  # fmt: skip
        try:
            _hold_until_restarted(proc, fleet, tmp_path)
            log = proc.communicate(timeout=800)[0]
        finally:
            if proc.poll() is None:
                proc.kill()
            stop.set()
            supervisor.join(60)
        restarts = fleet.servers[0].restarts
    assert proc.returncode == 0, log[-6000:]
    assert fleet.mark.exists(), "the server never died in a broadcast"
    assert restarts == 1
    rows = [json.loads(line) for line in (tmp_path / "runs" / "job" / "metrics.jsonl")
            .read_text().splitlines()]  # fmt: skip
    rows = [r for r in rows if "rollout/samples" in r]
    assert [r["step"] for r in rows] == list(range(steps)), [r["step"] for r in rows]
    assert all(r["rollout/samples"] == 16 for r in rows)
    sync_s = [r["time/sync_s"] for r in rows]
    assert max(sync_s) < 30, sync_s  # no step waited out a group timeout
    assert rows[-1]["rollout/sglang/weight_retries"] >= 1  # the death cost a retry ...
    assert "rebuilding the group" in log and "do not answer: left out of the group" in log
    worst = [r["mismatch/logp_abs_max"] for r in rows[2:]]  # steps after the restart
    assert max(worst) < 1e-3, worst  # ... and the restarted server caught up


def _join(url: str, store: object, name: str):  # type: ignore[no-untyped-def]
    """Rank 0 (this process) and the server (rank 1, another process) build group ``name``."""
    from concurrent.futures import ThreadPoolExecutor

    from launch.servers import http
    from megatron_rl.rollout import weight_group

    port = store.port  # type: ignore[attr-defined]
    body = {"master_address": "127.0.0.1", "master_port": port, "rank_offset": 1,
            "world_size": 2, "group_name": name, "backend": "gloo"}  # fmt: skip
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(http, "POST", f"{url}/init_weights_update_group", body, 60)
        pg = weight_group.trainer_group(store, 2, name, "gloo")
        assert answer.result()[0] == 200, answer.result()
    return pg


def _bucket(url: str, name: str, timeout: float) -> tuple[int, float]:
    from launch.servers import http

    body = {"names": ["w"], "dtypes": ["float32"], "shapes": [[4]], "group_name": name,
            "flush_cache": False}  # fmt: skip
    t0 = time.monotonic()
    status, _ = http("POST", f"{url}/update_weights_from_distributed", body, timeout)
    return status, time.monotonic() - t0


def test_a_survivor_leaves_a_stale_group_on_a_new_init_or_after_the_bucket_timeout(
    tmp_path: Path,
) -> None:
    """The server (a `megatron-rl serve` process) sits in the receive of a bucket that rank 0
    never broadcasts (another member died). Rank 0 aborts its end and builds a new group: the
    stale receive fails at once and the server joins the new group. Where rank 0 aborts nothing,
    the server's per-bucket timeout (8 s) ends the wait. Before, it waited out the group's own
    timeout (30 min by default)."""
    from concurrent.futures import ThreadPoolExecutor

    import torch

    from benchmarks.tiny_model import make_tiny_qwen2
    from megatron_rl.rollout import weight_group

    model = make_tiny_qwen2(tmp_path / "m", "test", seed=0)
    fleet = Fleet(tmp_path / "f", str(model), 1, engine="hf", health_timeout_s=240,
                  server_args=["rollout.sglang.bucket_timeout_s=8"])  # fmt: skip
    store = weight_group.host_store("127.0.0.1", free_port())
    with fleet, ThreadPoolExecutor(2) as pool:
        url = fleet.servers[0].url
        old = _join(url, store, "g-old")
        stuck = pool.submit(_bucket, url, "g-old", 60)
        time.sleep(1.0)  # the server is in the receive now
        t0 = time.monotonic()
        weight_group.destroy(old)  # what rank 0 does after a fault: abort its end ...
        _join(url, store, "g-new")  # ... and build a new group
        status, _ = stuck.result(timeout=60)
        assert status == 400 and time.monotonic() - t0 < 6, time.monotonic() - t0
        status, took = _bucket(url, "g-new", 60)  # never broadcast: the bucket timeout
        assert status == 400 and 7 < took < 20, took
        pg = _join(url, store, "g-last")  # and a group built after that works
        answer = pool.submit(_bucket, url, "g-last", 60)
        time.sleep(0.5)
        weight_group.broadcast_bucket(pg, [torch.arange(4.0)], "cpu")
        assert answer.result(timeout=60)[0] == 200
