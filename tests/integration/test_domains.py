"""Unit tests of the domain API: extraction, determinism, splits, verifiers, rewards, task files."""

from __future__ import annotations

import asyncio
import json

import pytest

from megatron_rl.domains import (
    RewardWeights,
    Task,
    VerifyResult,
    compose_reward,
    extract_answer,
    load_domains,
    split_of,
)
from megatron_rl.domains.code_exec import run_program_subprocess
from megatron_rl.domains.jsonl import append_eval_failures, domains_from_files, export_failures
from megatron_rl.domains.pool import VerifierPool


@pytest.fixture(scope="module")
def domains():
    return load_domains()


def test_extract_answer_rules():
    assert extract_answer("blah <answer> 42 </answer> x <answer>7</answer>") == "7"
    assert extract_answer("  42\nbecause reasons") == "42"
    assert extract_answer("a\nb\n", multiline=True) == "a\nb"
    assert extract_answer("") == ""


def test_task_is_deterministic_and_splits_disjoint(domains):
    d = domains["rg/basic_arithmetic@0"]
    a, b = d.task("train", 5, seed=3), d.task("train", 5, seed=3)
    assert a == b and a.domain == d.name and a.level == 0
    assert d.task("train", 6, seed=3) != a
    train = {d.task("train", i, seed=1).prompt for i in range(40)}
    evals = {d.task("eval", i, seed=1).prompt for i in range(40)}
    assert not train & evals
    assert all(split_of(p) == "eval" for p in evals) and all(split_of(p) == "train" for p in train)


def test_task_rejects_bad_split_and_level(domains):
    d = domains["math/linear_equation"]
    with pytest.raises(ValueError, match="split='test'"):
        d.task("test", 0)
    with pytest.raises(ValueError, match="allowed"):
        d.task("train", 0, level=9)


@pytest.mark.parametrize(
    "answer,score",
    [
        ("0.5", 1.0),
        ("1/2", 1.0),
        ("\\boxed{\\frac{1}{2}}", 1.0),
        ("<answer>2/4</answer>", 1.0),
        ("0.6", 0.0),
        ("no idea", 0.0),
    ],
)
def test_math_accepts_equivalent_forms(domains, answer, score):
    d = domains["math/linear_equation"]
    task = Task(d.name, "train", 1, "t", "Solve for x: 2x + 0 = 1.", "\\frac{1}{2}", {})
    assert d.verify(task, answer).score == score


def test_verify_never_raises_on_hostile_input(domains):
    d = domains["rg/prime_factorization@0"]  # its scorer raises ValueError on non-numbers
    task = d.task("train", 0)
    res = d.verify(task, "not a number")
    assert res.score == 0.0 and not res.parsable
    assert d.verify(task, None).score == 0.0  # type: ignore[arg-type]
    assert d.verify(task, task.gold).score == 1.0


def test_reward_composition():
    w = RewardWeights(
        process={"compiles": 0.1}, format_penalty=0.2, length_penalty=0.5, length_budget_chars=10
    )
    r, terms = compose_reward(
        VerifyResult(1.0, True, process_scores={"compiles": 1.0}), "x" * 12, w
    )
    assert terms == {
        "reward/outcome": 1.0,
        "reward/process/compiles": 0.1,
        "reward/length_penalty": -0.5 * 2 / 1000,
    }
    assert r == pytest.approx(1.1 - 0.001)
    r, terms = compose_reward(VerifyResult(0.0, False), "", w)
    assert r == pytest.approx(-0.2)
    r, _ = compose_reward(VerifyResult(1.0, True, hard_violation=True), "ok", w)
    assert r == -1.0


def test_safety_hard_violation(domains):
    d = domains["safety/refuse"]
    task = d.task("train", 0)
    assert d.verify(task, "I can't help with that.").score == 1.0
    complied = d.verify(task, "Sure, here is how you do it step by step: first ...")
    assert complied.score == 0.0 and complied.hard_violation
    look = domains["safety/lookalike"]
    t = look.task("train", 0)
    assert look.verify(t, t.gold).score == 1.0
    assert look.verify(t, "I cannot help with that request.").score == 0.0


def test_tool_episode_with_real_sqlite(domains):
    d = domains["tool/sqlite"]
    task = d.task("train", 2, level=2)
    env = d.env(task)
    obs = env.step("I think the answer is big.")
    assert not obs.done and "<tool>" in obs.text
    query = task.meta["gold_actions"][0]
    obs = env.step(query)
    assert not obs.done and obs.text == f"<result>{task.gold}</result>"
    assert env.step("<tool>sql: DELETE FROM orders</tool>").text.startswith("<result>error")
    assert env.step(f"<answer>{task.gold}</answer>").done
    assert d.verify(task, f"<answer>{task.gold}</answer>").score == 1.0


def test_calculator_is_not_eval(domains):
    d = domains["tool/calculator"]
    env = d.env(d.task("train", 0))
    assert env.step("<tool>calculator: (2 + 3) * 4</tool>").text == "<result>20</result>"
    bad = env.step("<tool>calculator: __import__('os').system('true')</tool>").text
    assert bad.startswith("<result>error")


@pytest.mark.parametrize(
    "program,status",
    [
        ("def f(x):\n    return x + 1\n", "passed"),
        ("def f(x):\n    return x\n", "failed"),
        ("def f(x) return\n", "error"),
        ("import time\ntime.sleep(30)\n", "timeout"),
    ],
)
def test_subprocess_fallback_statuses(program, status):
    res = run_program_subprocess(program, "def test_f():\n    assert f(1) == 2\n", 3.0, 512)
    assert res.status == status


def test_code_domain_scores_gold_and_wrong(domains):
    d = domains["code/fn_sum_multiples"]
    task = d.task("train", 0, level=1)
    assert d.verify(task, task.gold).score == 1.0
    wrong = "```python\ndef sum_multiples(xs):\n    return 0\n```"
    res = d.verify(task, wrong)
    assert res.score == 0.0 and res.process_scores == {"compiles": 1.0}


def test_jsonl_task_set_and_export_failures(tmp_path, domains):
    rows = [
        {"prompt": "2+2?", "gold": "4", "verifier": "numeric", "split": "train"},
        {
            "prompt": "Capital of Peru?",
            "gold": "Lima",
            "verifier": "regex",
            "pattern": "(?i)lima",
            "split": "eval",
        },
    ]
    path = tmp_path / "mine.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d,) = domains_from_files([str(path)])
    assert d.name == "tasks/mine" and d.splits == ("train", "eval")
    t = d.task("eval", 0)
    assert d.verify(t, "LIMA").score == 1.0 and d.verify(t, "Cusco").score == 0.0
    assert d.verify(d.task("train", 3), "4.0").score == 1.0
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "x", "gold": "y", "verifier": "fuzzy"}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1: verifier 'fuzzy'"):
        domains_from_files([str(bad)])
    # a run's eval failures -> a task set scored by the source domain's verifier
    math = domains["math/linear_equation"]
    failing, fixed = math.task("eval", 0), math.task("eval", 1)
    append_eval_failures(tmp_path, 10, [(failing, "7", 0.0), (fixed, "0", 0.0)])
    append_eval_failures(tmp_path, 20, [(fixed, fixed.gold, 1.0)])
    out = tmp_path / "failures.jsonl"
    assert export_failures(tmp_path, out) == 1
    (fd,) = domains_from_files([str(out)])
    ft = fd.task("train", 0)
    assert ft.prompt == failing.prompt and fd.verify(ft, failing.gold).score == 1.0
    assert fd.verify(ft, "not it").score == 0.0


def test_load_domains_globs_and_errors(domains):
    got = load_domains(["rg/basic_arithmetic@*", "math/*"], exclude=["math/power"])
    assert "rg/basic_arithmetic@2" in got and "math/mean" in got and "math/power" not in got
    with pytest.raises(ValueError, match="closest: .*'rg/basic_arithmetic@0'"):
        load_domains(["rg/basic_arithmetic@9"])


def test_pool_matches_inline(domains):
    names = ["math/fraction_add", "rg/chain_sum@1", "format/json_schema", "safety/refuse"]
    pairs = []
    for n in names:
        t = domains[n].task("train", 0)
        pairs += [(t, t.gold), (t, "wrong answer here")]
    inline = [r.score for r in VerifierPool(0).verify(pairs)]
    with VerifierPool(workers=2, chunk_size=3) as pool:
        pooled = [r.score for r in pool.verify(pairs)]
        pooled_async = [r.score for r in asyncio.run(pool.averify(pairs))]
    assert inline == pooled == pooled_async == [1.0, 0.0] * len(names)
