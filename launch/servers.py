"""Start, watch and stop rollout servers and sglang-router: one :class:`Fleet` per node.

A fleet is ``num_servers`` rollout servers on this node (SGLang on GPUs, the embedded
``megatron-rl serve`` on CPUs) plus, optionally, the router in front. It

1. starts every process in its own session, logging to ``<run_dir>/logs/<name>.log``;
2. waits for each server's ``/health`` (bounded: ``ValueError`` naming the server and the tail of
   its log when it exits or is not healthy in time) and registers it with the router through
   ``POST /workers``; the router runs with retries disabled, so every retry is the client's
   and is counted in its metrics. Seeds, GPUs, flags and health-check settings of each process
   come from :mod:`launch.server_args`;
3. writes ``<run_dir>/servers.json``: role, host, port, URL, pid, GPUs and log of each process;
4. :meth:`Fleet.supervise` (a loop; one pass is :meth:`Fleet.check`): a server that died is
   removed from the router (``DELETE /workers/{id}``), restarted, brought to the current weights
   (``<sync_dir>/current_weights.json`` written by the client after each sync) and re-added;
5. every process gets the job's API key (:mod:`megatron_rl.rollout.auth`): embedded servers in
   their environment, SGLang and the router as ``--api-key`` (their only way in; the manifest
   shows it blanked), and every call the fleet makes carries it;
6. :meth:`Fleet.stop` terminates everything by PID (SIGTERM to the process group, SIGKILL after
   a grace period); the fleet is a context manager, so a failure anywhere stops it too.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from launch import server_args as sargs
from launch.fleet_procs import Proc as Proc  # re-export
from launch.fleet_procs import die_with_parent, redact, signal_group, tail
from launch.fleet_procs import free_port as free_port  # re-export
from launch.fleet_procs import http as http  # re-export
from launch.server_args import assign_gpus, step_gpus
from launch.server_args import visible_gpus as visible_gpus  # re-export
from megatron_rl.rollout.auth import API_KEY_ENV, fleet_key

log = logging.getLogger(__name__)


class Fleet:
    """Rollout servers (+ router) of one node. See the module docstring."""

    def __init__(
        self,
        run_dir: str | Path,
        model: str,
        num_servers: int,
        engine: str = "vllm",
        gpus_per_server: int = 0,
        router_port: int | None = None,
        router_url: str | None = None,
        host: str | None = None,
        health_timeout_s: float = 300.0,
        server_args: list[str] | None = None,
        sync_dir: str | None = None,
        gpu_ids: list[int] | None = None,
        sglang_args: list[str] | None = None,
        seed: int = 0,
        node_index: int = 0,
        router_policy: str = "cache_aware",
        health_check_timeout_s: float = 300.0,
        api_key: str | None = None,
        bind: str | None = None,
    ) -> None:
        if num_servers < 0:
            raise ValueError(f"num_servers must be >= 0, got {num_servers}")
        self.run_dir = Path(run_dir)
        self.model = model
        self.engine = engine
        self.health_timeout_s = health_timeout_s
        self.server_args = server_args or []  # embedded servers: --config/overrides
        self.sglang_args = sglang_args or []  # SGLang: its own flags (sglang_server_args)
        self.sync_dir = Path(sync_dir) if sync_dir else self.run_dir / "rollout_weights"
        self.host = host or "127.0.0.1"  # where the servers and the router are reached
        self.bind = bind or self.host  # where they listen (0.0.0.0 only when asked for)
        self.api_key = api_key or fleet_key(self.run_dir)  # servers, router and our calls
        self.seed, self.node_index = seed, node_index  # seeds: server_args.server_seed
        self.router_policy = router_policy
        self.health_check_timeout_s = health_check_timeout_s  # > the longest weight update
        self.logs = self.run_dir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        if engine != "sglang" and gpus_per_server and not step_gpus(gpu_ids):
            log.warning("no GPUs visible: the %s servers run on CPU", engine)
            gpus_per_server = 0  # the embedded engines run anywhere; SGLang needs its GPUs
        gpus = assign_gpus(num_servers, gpus_per_server, gpu_ids)
        tag = socket.gethostname().split(".")[0]
        self.servers = [
            Proc(f"server-{tag}-{i}", "server", self.host, free_port(), g, "")
            for i, g in enumerate(gpus)
        ]
        for i, p in enumerate(self.servers):
            p.seed = sargs.server_seed(seed, node_index, len(gpus), i)
        for p in self.servers:
            p.log = str(self.logs / f"{p.name}.log")
        self.router: Proc | None = None
        if router_port is not None:
            log_file = str(self.logs / "router.log")
            self.router = Proc("router", "router", self.host, router_port, [], log_file)
        self.router_url = self.router.url if self.router else router_url
        self._popen: dict[str, subprocess.Popen[bytes]] = {}
        self._worker_ids: dict[str, str] = {}

    # ---- commands -------------------------------------------------------------------------
    def server_cmd(self, p: Proc) -> list[str]:
        if self.engine == "sglang":  # the real SGLang server, GPU nodes
            return [
                *[sys.executable, "-m", "sglang.launch_server", "--model-path", self.model],
                *["--host", self.bind, "--port", str(p.port), "--tp-size", str(len(p.gpus))],
                *["--api-key", self.api_key],  # SGLang takes it only as a flag
                *self.sglang_args,
                *["--random-seed", str(p.seed)],
            ]
        return [
            *[sys.executable, "-m", "launch.cli", "serve", "--model", self.model],
            *["--port", str(p.port), "--host", self.bind, "--engine", self.engine],
            *self.server_args,
            *["--seed", str(p.seed)],
        ]

    def router_cmd(self, p: Proc) -> list[str]:
        return sargs.router_cmd(
            self.bind,
            p.port,
            metrics_port=free_port(),
            policy=self.router_policy,
            health_check_timeout_s=self.health_check_timeout_s,
            startup_timeout_s=self.health_timeout_s,
            api_key=self.api_key,
        )

    def _spawn(self, p: Proc, cmd: list[str]) -> None:
        env = dict(os.environ)
        env[API_KEY_ENV] = self.api_key  # the embedded servers read it there, not from argv
        if p.role == "server":
            env.update(sargs.server_env(self.health_check_timeout_s))
        if p.gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, p.gpus))
        with open(p.log, "ab") as out:
            proc = subprocess.Popen(
                cmd,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )
        self._popen[p.name] = proc
        p.pid, p.cmd = proc.pid, cmd
        log.info("started %s (pid %d) on %s", p.name, p.pid, p.url)

    # ---- start / health -------------------------------------------------------------------
    def start(self) -> Fleet:
        if self.router is not None:
            self._spawn(self.router, self.router_cmd(self.router))
        for p in self.servers:
            self._spawn(p, self.server_cmd(p))
        if self.router is not None:
            self.wait_healthy(self.router, "/health")
        for p in self.servers:
            self.wait_healthy(p, "/health")
            # A trainer may already be running (restarted node); a record left by an earlier
            # job may be stale, and the trainer pushes its weights at start anyway.
            if not self.load_current_weights(p, self.current_weights()):
                log.warning("%s keeps its initial weights until the trainer's push", p.name)
            self.register(p)
        self.write_manifest()
        return self

    def wait_workers(self, expected: int) -> None:
        """Wait until the router lists ``expected`` healthy workers (ValueError on timeout)."""
        deadline = time.monotonic() + self.health_timeout_s
        healthy: list[str] = []
        while time.monotonic() < deadline:
            healthy = [w["url"] for w in self.router_workers() if w.get("is_healthy", True)]
            if len(healthy) >= expected:
                return
            time.sleep(1.0)
        raise ValueError(
            f"router {self.router_url} lists {len(healthy)} healthy servers {healthy} after "
            f"{self.health_timeout_s:.0f} s, expected {expected}; server logs: {self.logs}"
        )

    def wait_healthy(self, p: Proc, path: str) -> None:
        deadline = time.monotonic() + self.health_timeout_s
        while time.monotonic() < deadline:
            proc = self._popen.get(p.name)
            if proc is not None and proc.poll() is not None:
                raise ValueError(
                    f"{p.name} ({' '.join(p.cmd[:6])} ...) exited with code {proc.returncode} "
                    f"before becoming healthy; last lines of {p.log}:\n{tail(p.log)}"
                )
            if http("GET", p.url + path, timeout=2, key=self.api_key)[0] == 200:
                return
            time.sleep(0.5)
        raise ValueError(
            f"{p.name} at {p.url} was not healthy after {self.health_timeout_s:.0f} s; "
            f"last lines of {p.log}:\n{tail(p.log)}"
        )

    def register(self, p: Proc) -> None:
        """Add a server to the router and wait until the router lists it."""
        if not self.router_url:
            return
        deadline = time.monotonic() + self.health_timeout_s
        status, text = 0, ""
        while status not in (200, 201, 202) and time.monotonic() < deadline:
            status, text = http(
                "POST", f"{self.router_url}/workers", {"url": p.url}, 10, self.api_key
            )
            if status == 0:  # router not up yet (it may start on another node)
                time.sleep(1.0)
            elif status not in (200, 201, 202):
                raise ValueError(f"router {self.router_url} refused {p.url}: {status} {text}")
        if status == 0:
            raise ValueError(f"router {self.router_url} unreachable for {self.health_timeout_s} s")
        while time.monotonic() < deadline:
            for w in self.router_workers():
                if w["url"].rstrip("/") == p.url and w.get("is_healthy", True):
                    self._worker_ids[p.name] = w["id"]
                    return
            time.sleep(0.3)
        raise ValueError(f"router {self.router_url} never listed worker {p.url} as healthy")

    def router_workers(self) -> list[dict[str, Any]]:
        status, text = http("GET", f"{self.router_url}/workers", key=self.api_key)
        return list(json.loads(text).get("workers", [])) if status == 200 else []

    def write_manifest(self) -> Path:
        procs = ([self.router] if self.router else []) + self.servers
        out = self.run_dir / f"servers-{socket.gethostname().split('.')[0]}.json"
        rows = [asdict(p) | {"cmd": redact(p.cmd, self.api_key)} for p in procs]
        data = {"router_url": self.router_url, "processes": rows}
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=2))
        tmp.replace(out)
        return out

    # ---- supervision ----------------------------------------------------------------------
    def check(self) -> list[str]:
        """One supervision pass; returns the names of servers it restarted."""
        restarted = []
        for p in self.servers:
            proc = self._popen.get(p.name)
            if proc is None or proc.poll() is None:
                continue
            log.warning("%s (pid %d) died with code %s; restarting", p.name, p.pid, proc.returncode)
            self.deregister(p)
            p.seed += sargs.SEED_STRIDE_RESTART  # a fresh stream, not a replay
            p.port = free_port()  # a new URL: the trainer sees the change and rebuilds its
            self._spawn(p, self.server_cmd(p))  # weight-update group with this server in it
            self.wait_healthy(p, "/health")
            p.restarts += 1
            loaded = self.catch_up(p)
            if loaded is False:  # never serve stale weights: try again on the next pass
                signal_group(self._popen[p.name].pid, signal.SIGKILL)
                self._popen[p.name].wait(30)
                continue
            self.register(p)
            self.catch_up(p, loaded)  # only a newer record: a reload could undo a broadcast
            restarted.append(p.name)
            self.write_manifest()
        return restarted

    def deregister(self, p: Proc) -> None:
        wid = self._worker_ids.pop(p.name, None)
        if self.router_url and wid:
            http("DELETE", f"{self.router_url}/workers/{wid}", key=self.api_key)

    def current_weights(self) -> dict[str, Any] | None:
        """``current_weights.json`` (path and version of the last sync; None before the first)."""
        f = self.sync_dir / "current_weights.json"
        return json.loads(f.read_text()) if f.is_file() else None

    def catch_up(self, p: Proc, loaded: Any = False) -> Any:
        """Load the record into ``p`` until it stops moving, never ``loaded`` (``p`` holds it);
        returns the record loaded last, False on failure."""
        for _ in range(5):
            cur = self.current_weights()
            if cur == loaded:
                return loaded
            if not self.load_current_weights(p, cur):
                return False
            loaded = cur
        return loaded

    def load_current_weights(self, p: Proc, cur: dict[str, Any] | None) -> bool:
        """Bring ``p`` to ``cur`` (a :meth:`current_weights` record); False on failure."""
        if cur is None:
            return True  # no sync yet: the server already holds the initial weights
        body = {"model_path": cur["path"], "weight_version": cur["version"]}
        status, text = http("POST", f"{p.url}/update_weights_from_disk", body, 600, self.api_key)
        if status != 200:
            log.error("%s could not load the current weights %s: %s", p.name, cur, text[:300])
            return False
        log.info("%s loaded weight version %s before rejoining", p.name, cur["version"])
        return True

    def supervise(self, poll_s: float = 1.0, stop_file: Path | None = None) -> None:
        """Restart dead servers until SIGTERM/SIGINT (or ``stop_file`` appears)."""
        stopping = []
        old = signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
        try:
            while not stopping and not (stop_file and stop_file.exists()):
                if self.router and self._popen["router"].poll() is not None:
                    raise RuntimeError(f"the router died; last lines:\n{tail(self.router.log)}")
                self.check()
                time.sleep(poll_s)
        finally:
            signal.signal(signal.SIGTERM, old)

    # ---- stop -----------------------------------------------------------------------------
    def kill_server(self, index: int, sig: int = signal.SIGKILL) -> int:
        """Kill one server (fault injection and tests); returns its pid."""
        p = self.servers[index]
        os.kill(p.pid, sig)
        return p.pid

    def stop(self, grace_s: float = 10.0) -> None:
        procs = list(self._popen.values())
        for proc in procs:
            if proc.poll() is None:
                signal_group(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for proc in procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                signal_group(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)
        self._popen.clear()

    def __enter__(self) -> Fleet:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()
