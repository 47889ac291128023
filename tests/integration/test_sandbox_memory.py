"""The memory bound of a sandbox: a cgroup around the whole sandbox where the machine offers one
(cgroup v2 with memory delegated, or a writable cgroup v1 memory controller), else per process,
said once at start-up and printed by ``megatron-rl info``.

What to assert is chosen from what this machine offers, found here without the sandbox's code
(``machine_offers``), so the tests pass on a root machine with a writable v1 memory controller
(this one) and on a CI machine with neither; the fallback is also run here by hiding the
cgroups from detection. No test leaves a cgroup behind.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time

import pytest

from launch import cli
from launch.commands import info
from megatron_rl.sandbox import Limits, memory, run_program

# three processes of 80 MiB each: every one is under the per-process limit, together they are not
FORK_PROGRAM = """
import os, sys, time
kids = []
for _ in range(3):
    pid = os.fork()
    if pid == 0:
        blob = bytes([1]) * (80 << 20)
        time.sleep(1.5)
        os._exit(0)
    kids.append(pid)
codes = [os.waitpid(pid, 0)[1] for pid in kids]
print("children", codes)
sys.exit(0 if codes == [0, 0, 0] else 1)
"""
LIMITS = Limits(timeout_s=20.0, memory_mb=160)


def _own(controller: str) -> str | None:
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, names, path = line.rstrip("\n").split(":", 2)
            if controller in (names.split(",") if names else [""]):
                return path
    return None


def machine_offers() -> str:
    """Which bound this machine can give, probed directly (mount table, own cgroup, mkdir)."""
    with open("/proc/self/mounts") as f:
        mounts = [line.split() for line in f]
    for _, point, fstype, opts, *_ in mounts:
        own = _own("") if fstype == "cgroup2" else _own("memory")
        if own is None or fstype not in ("cgroup", "cgroup2"):
            continue
        if fstype == "cgroup" and "memory" not in opts.split(","):
            continue
        where = os.path.join(point, own.lstrip("/"))
        if fstype == "cgroup2":
            try:
                with open(os.path.join(where, "cgroup.subtree_control")) as sub:
                    if "memory" not in sub.read().split():
                        continue
            except OSError:
                continue
        probe = os.path.join(where, f"mrl-test-probe-{os.getpid()}")
        try:
            os.mkdir(probe)
            os.rmdir(probe)
            return "cgroup-v2" if fstype == "cgroup2" else "cgroup-v1"
        except OSError:
            continue
    return "per-process"


def sandbox_cgroups(bound: memory.MemoryBound) -> list[str]:
    if not bound.parent:
        return []
    return [e for e in os.listdir(bound.parent) if e.startswith(f"{memory.PREFIX}-{os.getpid()}-")]


@pytest.fixture
def per_process(monkeypatch):
    """Detection as on a machine without a usable cgroup."""
    memory.detect.cache_clear()
    monkeypatch.setattr(memory, "find_parent", lambda kind, *_: (None, f"{kind}: hidden by test"))
    yield
    memory.detect.cache_clear()


def test_detect_matches_what_the_machine_offers():
    bound = memory.detect()
    assert bound.kind == machine_offers()
    if bound.kind == "per-process":
        assert bound.parent == "" and "cgroup-v1" in bound.detail and "cgroup-v2" in bound.detail
    else:
        assert os.path.isdir(bound.parent) and sandbox_cgroups(bound) == []


def test_info_prints_the_bound_in_force(capsys):
    assert cli.main(["info", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    kind = machine_offers()
    if kind == "per-process":
        assert out["sandbox"]["memory"].startswith("per process only")
    else:
        assert out["sandbox"]["memory"].startswith(f"per sandbox: {kind} memory cgroup under /")
    info._print_text(out)  # the text form prints the same line
    rows = re.findall(r"^sandbox memory +(.+)$", capsys.readouterr().out, re.MULTILINE)
    assert rows == [out["sandbox"]["memory"]]


def test_the_bound_covers_the_whole_sandbox_where_a_cgroup_exists():
    bound = memory.detect()
    res = run_program(FORK_PROGRAM, limits=LIMITS)
    if bound.kind == "per-process":  # each process is under its limit: nothing stops the sum
        assert res.status == "passed", (res.reason, res.stderr[-500:])
        assert "children [0, 0, 0]" in res.stdout
    else:  # 3 x 80 MiB > 160 MiB for the sandbox: the kernel kills one, the run is an oom
        assert res.status == "oom", (res.status, res.reason, res.stdout, res.stderr[-500:])
        assert "memory cgroup" in res.reason
        assert "children [0, 0, 0]" not in res.stdout
    assert sandbox_cgroups(bound) == []


def test_each_sandbox_gets_its_own_cgroup_with_the_limit():
    bound = memory.detect()
    seen: dict[str, str] = {}
    run = threading.Thread(
        target=run_program, args=("import time\ntime.sleep(3)\n",), kwargs={"limits": LIMITS}
    )
    run.start()
    deadline = time.monotonic() + 10
    want = str(LIMITS.memory_mb << 20)
    # the sandbox makes its cgroup, then writes the limit, then adds the process: a directory
    # seen between the first two still shows the default, so poll until the limit is there
    while bound.parent and run.is_alive() and time.monotonic() < deadline:
        if want in seen.values():
            break
        for name in sandbox_cgroups(bound):
            limit_file = memory._LIMIT_FILES[bound.kind][0]
            try:
                with open(os.path.join(bound.parent, name, limit_file)) as f:
                    seen[name] = f.read().strip()
            except OSError:
                pass
        time.sleep(0.05)
    run.join()
    if bound.kind == "per-process":
        assert seen == {}
    else:
        assert list(seen.values()) == [want]
    assert sandbox_cgroups(bound) == []


def test_no_cgroup_is_left_after_timeouts_and_kills():
    bound = memory.detect()
    short = Limits(timeout_s=1.0, memory_mb=160)
    statuses = [
        run_program("while True:\n    pass\n", limits=short).status,
        run_program("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n").status,
        run_program("x = bytearray(1 << 34)\n", limits=short).status,
    ]
    assert statuses == ["timeout", "killed", "oom"]
    assert sandbox_cgroups(bound) == []


def test_without_a_cgroup_the_bound_is_per_process_and_said_once(per_process, caplog):
    with caplog.at_level(logging.INFO, logger=memory.__name__):
        first, second = memory.detect(), memory.detect()
    assert first is second and first.kind == "per-process" and first.parent == ""
    said = [r for r in caplog.records if r.name == memory.__name__]
    assert len(said) == 1 and said[0].levelno == logging.WARNING
    assert "per process only" in said[0].getMessage() and "hidden by test" in said[0].getMessage()
    res = run_program(FORK_PROGRAM, limits=LIMITS)
    assert res.status == "passed" and "children [0, 0, 0]" in res.stdout


def test_v2_parent_is_the_own_cgroup_when_memory_is_delegated(tmp_path):
    group = tmp_path / "user.slice" / "job"
    group.mkdir(parents=True)
    (group / "cgroup.controllers").write_text("cpu io memory pids\n")
    (group / "cgroup.subtree_control").write_text("memory pids\n")
    mountinfo = f"30 25 0:26 / {tmp_path} rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
    assert memory.find_parent("cgroup-v2", mountinfo, "0::/user.slice/job\n") == (str(group), "")
    (group / "cgroup.controllers").write_text("cpu io pids\n")
    parent, why = memory.find_parent("cgroup-v2", mountinfo, "0::/user.slice/job\n")
    assert parent is None and "not available" in why
    assert memory.find_parent("cgroup-v1", mountinfo, "0::/user.slice/job\n")[0] is None
