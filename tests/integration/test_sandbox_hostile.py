"""Adversarial suite: every program in tests/integration/sandbox_hostile/ must get no reward, leave
the host exactly as it was, and see nothing of it.

Each program is run with a tests file whose expected values are random per session, so the only
way to pass is to cheat. The host side of each check is real: a TCP, a UDP and an abstract unix
socket listening on loopback (they count every connection or datagram), a canary directory with
a secret, a bystander process, and scans for leftover processes and files; a random marker is
planted in the host's environment, an open host file, its temp directory's name and its session
keyring (sandbox_markers.py) and must not appear in anything a program outputs. A program's
first line ``# expect: a,b`` lists the statuses it may end with; ``passed`` is never allowed.
Programs that try what the seccomp filter denies report each attempt as a line ``blocked NAME
ERRNO`` or ``ESCAPED NAME``; their ``# blocked: NAME[:ERRNO], ...`` header lines name the attempts
that must be reported blocked (with EPERM unless an errno is given), and no program may print a
line starting with ``ESCAPED``.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import threading
from dataclasses import replace
from pathlib import Path

import psutil
import pytest
from sandbox_markers import HostMarker

from megatron_rl.sandbox import Limits, isolation, run_program

HOSTILE_DIR = Path(__file__).parent / "sandbox_hostile"
PROGRAMS = sorted(p.name for p in HOSTILE_DIR.glob("*.py"))
LIMITS = Limits(timeout_s=10.0, memory_mb=256, max_output_bytes=256 << 10)
# programs expected to hang get a short wall time; the rest a long one, so a loaded CI machine
# does not turn a fast verdict into a timeout
HANG_LIMITS = replace(LIMITS, timeout_s=2.0)
PWNED_PATHS = ["/tmp/mrl_pwned_write", "/tmp/mrl_pwned_daemon", "/work/main/mrl_pwned",
               "/usr/mrl_pwned", "/mrl_pwned"]  # fmt: skip


class Listener:
    """Loopback TCP + UDP + abstract-unix listeners that count whatever reaches them."""

    def __init__(self) -> None:
        self.hits: list[str] = []
        self.tcp = socket.create_server(("127.0.0.1", 0))
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind(("127.0.0.1", 0))
        self.abstract = f"mrl-hostile-{os.getpid()}"
        self.unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.unix.bind("\0" + self.abstract)
        self.unix.listen()
        self.port, self.udp_port = self.tcp.getsockname()[1], self.udp.getsockname()[1]
        for sock in (self.tcp, self.udp, self.unix):
            sock.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            for name, sock in (("tcp", self.tcp), ("unix", self.unix)):
                try:
                    conn, _ = sock.accept()
                    self.hits.append(name)
                    conn.close()
                except OSError:
                    pass
            try:
                self.udp.recvfrom(100)
                self.hits.append("udp")
            except OSError:
                pass

    def still_listening(self) -> bool:
        before = len(self.hits)
        socket.create_connection(("127.0.0.1", self.port), timeout=2).close()
        for _ in range(50):
            if len(self.hits) > before:
                del self.hits[before:]
                return True
            threading.Event().wait(0.05)
        return False

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        for sock in (self.tcp, self.udp, self.unix):
            sock.close()


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    canary = tmp_path_factory.mktemp("canary")
    secret = f"mrl-secret-{random.getrandbits(64):x}"
    (canary / "secret.txt").write_text(secret)
    listener = Listener()
    bystander = subprocess.Popen(["sleep", "600"])
    expected = {n: random.randrange(10**6) for n in (3, 17, 256)}
    marker = HostMarker()
    marker.plant()
    yield {"canary": canary, "secret": secret, "listener": listener, "bystander": bystander,
           "expected": expected, "marker": marker}  # fmt: skip
    marker.remove()
    bystander.kill()
    bystander.wait()
    listener.close()


def make_tests(expected: dict[int, int]) -> str:
    return "".join(
        f"def test_{i}():\n    assert oracle({n}) == {v}\n\n"
        for i, (n, v) in enumerate(expected.items())
    )


def snapshot(canary: Path) -> dict[str, tuple[int, float, int]]:
    return {
        str(p): (p.stat().st_size, p.stat().st_mtime, p.stat().st_mode) for p in canary.rglob("*")
    }


def leftover_processes() -> list[str]:
    """Live host processes a sandbox may have left: with one of this process's sandbox uids,
    with the hostile programs' marker, or descending from this test process.

    Zombies are skipped: bwrap's pid-1 process ends as an already-dead zombie that this
    machine's init reaps a second or so later; it runs nothing and holds no resources.
    """
    found = []
    for proc in psutil.process_iter(["pid", "uids", "cmdline", "status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            uid = proc.info["uids"].real if proc.info["uids"] else -1
            cmd = " ".join(proc.info["cmdline"] or [])
        except (psutil.Error, AttributeError):
            continue
        if uid in isolation.UIDS.uids or "mrl-hostile-marker" in cmd:
            found.append(f"{proc.info['pid']} uid={uid} {cmd}")
    found += [f"child {c.pid} {c.name()}" for c in psutil.Process().children(recursive=True)
              if c.pid != -1]  # fmt: skip
    return found


def render(name: str, host: dict) -> str:
    text = (HOSTILE_DIR / name).read_text()
    replacements = {
        "__PORT__": str(host["listener"].port),
        "__UDP_PORT__": str(host["listener"].udp_port),
        "__ABSTRACT__": host["listener"].abstract,
        "__SECRET_PATH__": str(host["canary"] / "secret.txt"),
        "__CANARY_DIR__": str(host["canary"]),
    }
    for key, value in replacements.items():
        text = text.replace(key, value)
    return text


def blocked_attempts(program: str) -> list[tuple[str, str]]:
    """(name, errno name) of each attempt the program's ``# blocked:`` lines name."""
    found = []
    for line in program.splitlines():
        if not line.startswith("#"):
            break
        if line.startswith("# blocked:"):
            for item in line.removeprefix("# blocked:").split(","):
                name, _, err = item.strip().partition(":")
                found.append((name, err or "EPERM"))
    return found


def test_suite_is_big_enough():
    assert len(PROGRAMS) >= 30


@pytest.mark.parametrize("name", PROGRAMS)
def test_hostile_program(name, host):
    program = render(name, host)
    allowed = program.splitlines()[0].removeprefix("# expect:").strip().split(",")
    before = snapshot(host["canary"])
    procs_before = set(leftover_processes())  # earlier tests may leave helpers (forkserver)
    limits = HANG_LIMITS if "timeout" in allowed else LIMITS
    res = run_program(program, make_tests(host["expected"]), limits=limits)

    assert not res.passed and res.tests_passed < len(host["expected"])
    assert res.status in allowed, (res.status, res.reason, res.stderr[-500:])
    lines = res.stdout.splitlines()
    assert not [line for line in lines if line.startswith("ESCAPED")], res.stdout[-3000:]
    for attempt, err in blocked_attempts(program):
        assert f"blocked {attempt} {err}" in lines, (attempt, res.stdout[-3000:], res.stderr[-500:])
    assert host["secret"] not in res.stdout + res.stderr + res.reason
    assert not host["marker"].found_in(res.stdout, res.stderr, res.reason, *res.failures)
    assert snapshot(host["canary"]) == before
    assert (host["canary"] / "secret.txt").read_text() == host["secret"]
    assert not [p for p in PWNED_PATHS if os.path.exists(p)]
    assert host["listener"].hits == []
    assert host["listener"].still_listening()
    assert host["bystander"].poll() is None
    after = leftover_processes()
    assert host_child(host) in after
    assert sorted(set(after) - procs_before) == []


def host_child(host: dict) -> str:
    return f"child {host['bystander'].pid} sleep"


def test_timeout_kills_with_sigkill_even_when_signals_ignored(host):
    program = render("ignore_signals.py", host) + "\noracle(0)\n"
    procs_before = set(leftover_processes())
    res = run_program(program, None, limits=HANG_LIMITS)
    assert res.status == "timeout"
    assert 2.0 <= res.duration_s < 8
    assert res.exit_code == -signal.SIGKILL
    assert sorted(set(leftover_processes()) - procs_before) == []
