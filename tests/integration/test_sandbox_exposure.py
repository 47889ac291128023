"""Nothing of the host reaches a sandboxed program, not even through /proc (docs/sandbox.md,
"Exposure review"; issue 24).

A random marker is planted in the host's environment, in an open host file, in its temp
directory's name, in its session keyring and on its command line (sandbox_markers.py); each
hostile program of the review looks for it everywhere it can read, and it must not appear in
anything the run outputs. The CLI tests run ``megatron-rl sandbox run PROG --tests T --json``
as a new user would, in a process that carries the marker in all those places.
"""

from __future__ import annotations

import ast
import ctypes
import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from sandbox_markers import HostMarker

from megatron_rl.sandbox import Limits, isolation, run_program

HOSTILE_DIR = Path(__file__).parent / "sandbox_hostile"
# one program per row of the review that could leak (docs/sandbox.md, "Exposure review")
EXPOSURE = ["proc_environ.py", "proc_cmdline.py", "proc_fd_scan.py", "proc_mountinfo.py",
            "proc_pid1_memory.py", "proc_walk.py", "session_keyring.py"]  # fmt: skip
TESTS = "def test_one():\n    assert oracle(3) == 123456\n"
LIMITS = Limits(timeout_s=20.0, memory_mb=256)


@pytest.fixture
def marker():
    mark = HostMarker()
    mark.plant()
    yield mark
    mark.remove()


def landlock_abi() -> int:
    """The kernel's Landlock ABI version as the host sees it (0: none)."""
    libc = ctypes.CDLL(None, use_errno=True)
    return max(0, libc.syscall(444, None, 0, 1))


def read_count(stdout: str) -> int:
    found = re.findall(r"^read (\d+)$", stdout, re.MULTILINE)
    assert found, stdout[-2000:]
    return int(found[-1])


@pytest.mark.parametrize("name", EXPOSURE)
def test_cli_run_shows_nothing_of_the_host(name, tmp_path):
    mark = HostMarker()
    try:
        program, tests = mark.dir / name, mark.dir / "tests.py"
        program.write_text((HOSTILE_DIR / name).read_text())
        tests.write_text(TESTS)
        done = subprocess.run(
            mark.command_line(program, tests), env=mark.env(), capture_output=True, text=True,
            timeout=120, cwd=tmp_path,
        )  # fmt: skip
    finally:
        mark.remove()
    assert done.returncode == 1, done.stderr[-2000:]
    assert mark.value in " ".join(mark.command_line(program, tests))  # it was on the command line
    result = json.loads(done.stdout)
    assert result["status"] == "failed" and result["sandboxed"] is True, result["reason"]
    assert not mark.found_in(done.stdout, done.stderr), result["stdout"][:3000]
    assert "FOUND" not in result["stdout"]
    # the program did read what it looked through (with Landlock, pid 1's memory is closed; the
    # seccomp filter denies every keyring call)
    closed = name == "proc_pid1_memory.py" and landlock_abi() >= 1
    assert read_count(result["stdout"]) >= (0 if closed or name == "session_keyring.py" else 1)
    if closed:
        assert "blocked 1 13" in result["stdout"]
    if name == "session_keyring.py":
        assert "blocked -3 1" in result["stdout"]  # keyctl on the session keyring: EPERM


def test_judge_sees_nothing_of_the_host(marker):
    tests = (
        "import os\n"
        "def test_look():\n"
        "    seen = []\n"
        "    for path in ('/proc/1/environ', '/proc/1/cmdline', '/proc/self/environ',\n"
        "                 '/proc/self/mountinfo'):\n"
        "        try:\n"
        "            seen.append(path + '=' + open(path, 'rb').read().decode(errors='replace'))\n"
        "        except OSError as e:\n"
        "            seen.append(path + ' blocked ' + str(e.errno))\n"
        "    assert False, ' | '.join(seen)\n"
    )
    res = run_program("def f():\n    return 1\n", tests, limits=LIMITS)
    assert res.status == "failed" and len(res.failures) == 1
    message = res.failures[0]
    assert "/proc/self/environ=PATH=/usr/bin:/bin" in message
    assert "/data/tests.py" in message  # the judge's cmdline: paths as seen inside only
    assert not marker.found_in(message, res.stdout, res.stderr)


def test_root_and_dev_are_read_only():
    res = run_program((HOSTILE_DIR / "write_root.py").read_text(), TESTS, limits=LIMITS)
    assert res.status == "failed"
    for path in ("/fill", "/dev/fill", "/harness/fill", "/data/fill"):
        assert f"blocked {path} 30" in res.stdout  # EROFS
    assert "MiB written outside the size-limited mounts: 0" in res.stdout


def test_pid1_is_out_of_reach_or_holds_nothing():
    program = (
        "import os, signal\n"
        "look = {'environ': lambda p: open(p, 'rb').read(), 'mem': lambda p: open(p, 'rb'),\n"
        "        'maps': lambda p: open(p, 'rb').read(), 'cwd': os.readlink,\n"
        "        'fd': lambda p: os.readlink(p + '/0')}\n"
        "for name, fn in look.items():\n"
        "    try:\n"
        "        fn(f'/proc/1/{name}')\n"
        "        print(name, 'readable')\n"
        "    except OSError as e:\n"
        "        print(name, 'errno', e.errno)\n"
        "try:\n    os.kill(1, 0)\n    print('signal ok')\nexcept OSError as e:\n"
        "    print('signal errno', e.errno)\n"
        "print('own environ', sorted(os.environ))\n"
    )
    res = run_program(program, limits=LIMITS)
    assert res.status == "passed", res.stderr
    assert "own environ ['HOME', 'LANG', 'PATH', 'PWD']" in res.stdout
    abi = landlock_abi()
    if abi >= 1:  # the harness's Landlock domain keeps pid 1 out of ptrace reach
        for name in ("environ", "mem", "maps", "fd"):
            assert f"{name} errno 13" in res.stdout, res.stdout
        assert ("signal errno 1" if abi >= 6 else "signal ok") in res.stdout
    else:  # no Landlock: pid 1 is readable, and holds only the sandbox's own environment
        check = "print(open('/proc/1/environ', 'rb').read())\n"
        env = run_program(check, limits=LIMITS).stdout
        assert env.strip() == repr(b"".join(f"{k}={v}\0".encode() for k, v in
                                            isolation.SANDBOX_ENV.items()))  # fmt: skip


def test_only_stdio_and_the_channel_are_open_inside(marker):
    program = (
        "import os\n"
        "fds = sorted(int(f) for f in os.listdir('/proc/self/fd'))\n"
        "links = {}\n"
        "for fd in fds:\n"
        "    try:\n"
        "        links[fd] = os.readlink(f'/proc/self/fd/{fd}').split(':')[0]\n"
        "    except OSError:\n"
        "        pass\n"
        "print(sorted(links.items()))\n"
        "def oracle(n):\n    return 0\n"
    )
    res = run_program(program, TESTS, limits=LIMITS)
    links = dict(ast.literal_eval(res.stdout.strip()))  # the printed (fd, kind) pairs
    assert links[0] == "/dev/null" and links[1] == links[2] == "pipe"
    assert sorted(v for k, v in links.items() if k > 2) == ["pipe", "pipe"]  # request, reply


def test_bwrap_is_given_no_host_path():
    launch = isolation.Launch(isolation.Mounts({"solution.py": b"x = 1\n"}, 8), ["/usr/bin/true"])
    try:
        options = launch.options.decode().split("\0")
        host_paths = [isolation.HARNESS_DIR, os.getcwd(), str(Path.home())]
        assert not [o for o in options + launch.argv if any(p in o for p in host_paths)]
        assert launch.argv[1:3] == ["--args", str(launch.pass_fds[-1])]
        sources = [options[i + 1] for i, o in enumerate(options) if o.endswith("bind")]
        assert sources == ["/usr"]  # the one host directory mounted, at the same path
    finally:
        launch.close()
