"""A real single-node Slurm cluster for tests: munged + slurmctld + slurmd, torn down by PID.

Nothing is mocked: the daemons are the Debian ``slurm-wlm`` and ``munge`` binaries, run as
root with a private key, socket, state and spool directory under a temporary folder, so the
machine's own ``/etc/slurm`` and ``/run/munge`` are never touched. The one node is named by
``hostname -s`` and has the machine's CPU count; ``proctrack/linuxproc`` + ``task/none`` need
no cgroups, so this runs inside containers. Clients find the cluster through ``SLURM_CONF``
(see :meth:`SlurmCluster.env`). Start-up took well under a second here.

Usage (pytest fixture in ``tests/integration/test_slurm*.py``)::

    with SlurmCluster(tmp_path) as cluster:
        job_id = cluster.sbatch(script_path)
        state = cluster.wait_job(job_id, timeout_s=120)
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd")


def slurm_available() -> str | None:
    """None when the binaries and root rights are there, else why not (for pytest.skip)."""
    missing = [d for d in (*DAEMONS, "sbatch", "squeue", "scontrol") if not _which(d)]
    if missing:
        return f"Slurm/munge binaries missing: {missing} (launch/setup_env.sh installs them)"
    if os.geteuid() != 0:
        return "the test Slurm cluster runs its daemons as root"
    return None


def _which(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin:/sbin")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _read_pid(path: Path, timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.is_file() and path.read_text().strip():
            return int(path.read_text().split()[0])
        time.sleep(0.05)
    raise RuntimeError(f"daemon did not write its pid file {path} within {timeout_s} s")


class SlurmCluster:
    """One node, one partition ``debug``, requeue allowed; every daemon's PID is recorded."""

    def __init__(self, root: Path, cpus: int | None = None) -> None:
        self.root = Path(root)
        self.node = socket.gethostname().split(".")[0]
        self.cpus = cpus or os.cpu_count() or 1
        self.conf = self.root / "slurm.conf"
        self.munge_socket = self.root / "munge.socket"
        self.pids: dict[str, int] = {}

    # ---- environment for clients --------------------------------------------------------
    def env(self) -> dict[str, str]:
        """os.environ plus SLURM_CONF pointing at this cluster."""
        env = dict(os.environ)
        env["SLURM_CONF"] = str(self.conf)
        # jobs inherit it: the venv's megatron-rl and torchrun, also when pytest is run directly
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        # jobs find the fleet's API key as a real job does: the fleet makes <run dir>/api_key
        env.pop("MEGATRON_RL_API_KEY", None)
        return env

    # ---- set-up -------------------------------------------------------------------------
    def _write_files(self) -> None:
        for sub in ("state", "spool", "log", "munge"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        os.chmod(self.root / "munge", 0o700)
        r = self.root
        self.conf.write_text(
            f"""ClusterName=mrltest
SlurmctldHost={self.node}
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.munge_socket}
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
JobRequeue=1
KillWait=5
MinJobAge=600
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
NodeName={self.node} CPUs={self.cpus} State=UNKNOWN
PartitionName=debug Nodes={self.node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
"""
        )

    def _spawn(self, name: str, argv: list[str], pid_file: Path) -> None:
        log = open(self.root / "log" / f"{name}.out", "ab")  # kept by child
        subprocess.run(argv, stdout=log, stderr=log, env=self.env(), check=True, timeout=30)
        log.close()
        self.pids[name] = _read_pid(pid_file, timeout_s=15)

    def start(self) -> SlurmCluster:
        self._write_files()
        r = self.root
        munged = [
            _which("munged") or "munged",
            "--force",
            f"--socket={self.munge_socket}",
            f"--key-file={r}/munge/munge.key",
            f"--pid-file={r}/munged.pid",
            f"--log-file={r}/log/munged.log",
            f"--seed-file={r}/munge/seed",
        ]
        self._spawn("munged", munged, r / "munged.pid")
        ctld = [_which("slurmctld") or "slurmctld", "-f", str(self.conf), "-c", "-i"]
        self._spawn("slurmctld", ctld, r / "slurmctld.pid")
        self._spawn(
            "slurmd", [_which("slurmd") or "slurmd", "-f", str(self.conf)], r / "slurmd.pid"
        )
        self._wait_node_idle(timeout_s=30)
        return self

    def _wait_node_idle(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        state = ""
        while time.monotonic() < deadline:
            out = self.run(["sinfo", "-h", "-N", "-o", "%T"], check=False)
            state = out.stdout.strip()
            if state.startswith("idle") or state.startswith("mixed"):
                return
            time.sleep(0.2)
        raise RuntimeError(f"Slurm node {self.node} not idle after {timeout_s} s (state {state!r})")

    # ---- clients ------------------------------------------------------------------------
    def run(self, argv: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            argv, env=self.env(), capture_output=True, text=True, timeout=30, check=check
        )

    def sbatch(self, script: Path, *args: str, env: dict[str, str] | None = None) -> int:
        full_env = self.env() | (env or {})
        out = subprocess.run(
            ["sbatch", "--parsable", *args, str(script)],
            env=full_env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        if out.returncode != 0:
            raise RuntimeError(f"sbatch failed: {out.stderr.strip()}")
        return int(out.stdout.strip().split(";")[0])

    def job_state(self, job_id: int) -> str:
        out = self.run(["scontrol", "show", "job", str(job_id)], check=False)
        for tok in out.stdout.split():
            if tok.startswith("JobState="):
                return tok.split("=", 1)[1]
        return "UNKNOWN"

    def wait_job(self, job_id: int, timeout_s: float, states: tuple[str, ...] = ()) -> str:
        """Wait until the job reaches one of ``states`` (default: any terminal state)."""
        final = states or ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_ME")
        deadline = time.monotonic() + timeout_s
        state = ""
        while time.monotonic() < deadline:
            state = self.job_state(job_id)
            if any(state.startswith(s) for s in final):
                return state
            time.sleep(0.3)
        raise TimeoutError(f"job {job_id} still {state} after {timeout_s} s (wanted {final})")

    # ---- tear-down ----------------------------------------------------------------------
    def stop(self) -> None:
        """SIGTERM each daemon by its recorded PID (slurmd, slurmctld, munged), then SIGKILL."""
        for name in reversed(list(self.pids)):
            _kill_pid(self.pids.pop(name))

    def __enter__(self) -> SlurmCluster:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _kill_pid(pid: int, grace_s: float = 10.0) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
