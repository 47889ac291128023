"""Math domains: procedurally generated problems whose answers are checked by ``math-verify``.

Names are ``math/<generator>`` with levels 1-3 inside each domain (bigger numbers, more terms).
Golds are LaTeX (``\\frac{3}{4}``, ``2\\sqrt{3}``); ``math-verify`` accepts equivalent forms, so
``0.75``, ``3/4`` and ``\\boxed{\\frac{3}{4}}`` all score 1.

Answers are checked by :func:`megatron_rl.domains.verifiers.math_equal` (shared with the JSONL
task sets; its docstring explains the timeouts); answers over ``MAX_CHARS`` never reach it.

Answer extraction differs from the default: the ``<answer>`` block if any, else the whole
response (``math-verify`` finds the last ``\\boxed{}`` or final expression itself).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from fractions import Fraction
from typing import Any

from megatron_rl.domains.base import Domain, Task, extract_answer
from megatron_rl.domains.verifiers import MATH_MAX_CHARS as MAX_CHARS
from megatron_rl.domains.verifiers import math_equal

__all__ = ["MAX_CHARS", "domains", "latex", "math_equal"]


def latex(q: Fraction) -> str:
    """``Fraction(3, 4)`` -> ``\\frac{3}{4}``; integers plainly."""
    if q.denominator == 1:
        return str(q.numerator)
    sign = "-" if q < 0 else ""
    return f"{sign}\\frac{{{abs(q.numerator)}}}{{{q.denominator}}}"


def _fraction_add(level: int, rng: random.Random) -> tuple[str, Fraction]:
    n = 2 + level
    terms = [Fraction(rng.randint(1, 9 * level), rng.randint(2, 6 * level + 3)) for _ in range(n)]
    text = " + ".join(f"{t.numerator}/{t.denominator}" for t in terms)
    return f"Compute {text}. Give the answer as a reduced fraction.", sum(terms, Fraction(0))


def _linear(level: int, rng: random.Random) -> tuple[str, Fraction]:
    a = rng.choice([i for i in range(-5 * level, 5 * level + 1) if i])
    b, c = rng.randint(-20 * level, 20 * level), rng.randint(-20 * level, 20 * level)
    return f"Solve for x: {a}x + {b} = {c}.", Fraction(c - b, a)


def _quadratic(level: int, rng: random.Random) -> tuple[str, Fraction]:
    r1, r2 = rng.randint(-6 * level, 6 * level), rng.randint(-6 * level, 6 * level)
    b, c = -(r1 + r2), r1 * r2
    return (f"What is the larger root of x^2 + ({b})x + ({c}) = 0?", Fraction(max(r1, r2)))


def _percent(level: int, rng: random.Random) -> tuple[str, Fraction]:
    p, n = rng.randint(1, 99), rng.randint(10, 10 ** (level + 1))
    return f"What is {p}% of {n}?", Fraction(p * n, 100)


def _derivative(level: int, rng: random.Random) -> tuple[str, Fraction]:
    coeffs = [rng.randint(-5, 5) for _ in range(level + 2)]
    x = rng.randint(-3, 3)
    poly = " + ".join(f"({c})x^{i}" for i, c in enumerate(coeffs))
    val = sum(i * c * x ** (i - 1) for i, c in enumerate(coeffs) if i)
    return f"Let f(x) = {poly}. What is f'({x})?", Fraction(val)


def _system(level: int, rng: random.Random) -> tuple[str, Fraction]:
    while True:
        a, b, c, d = (rng.randint(-4 * level, 4 * level) for _ in range(4))
        if a * d - b * c:
            break
    e, f = rng.randint(-30, 30), rng.randint(-30, 30)
    x = Fraction(e * d - b * f, a * d - b * c)
    return f"Solve the system {a}x + {b}y = {e}, {c}x + {d}y = {f}. What is x?", x


def _mean(level: int, rng: random.Random) -> tuple[str, Fraction]:
    xs = [rng.randint(-10 * level, 30 * level) for _ in range(3 + 2 * level)]
    return f"What is the mean of {', '.join(map(str, xs))}?", Fraction(sum(xs), len(xs))


def _series(level: int, rng: random.Random) -> tuple[str, Fraction]:
    a, d, n = rng.randint(-10, 20), rng.randint(1, 3 * level + 2), rng.randint(5, 10 * level + 10)
    return (
        f"What is the sum of the first {n} terms of the arithmetic sequence starting "
        f"{a}, {a + d}, {a + 2 * d}, ...?",
        Fraction(n * (2 * a + (n - 1) * d), 2),
    )


def _sqrt(level: int, rng: random.Random) -> tuple[str, str]:
    k, m = rng.randint(2, 4 + 3 * level), rng.choice([2, 3, 5, 6, 7, 10, 11])
    return f"Simplify sqrt({k * k * m}) to the form a\\sqrt{{b}}.", f"{k}\\sqrt{{{m}}}"


def _power(level: int, rng: random.Random) -> tuple[str, Fraction]:
    a, b = rng.randint(2, 5 + 2 * level), rng.randint(2, 3 + 2 * level)
    neg = level >= 2 and rng.random() < 0.5
    return (f"Compute {a}^({'-' if neg else ''}{b}).", Fraction(1, a**b) if neg else Fraction(a**b))


GENERATORS: dict[str, Callable[[int, random.Random], tuple[str, Any]]] = {
    "fraction_add": _fraction_add,
    "linear_equation": _linear,
    "quadratic_root": _quadratic,
    "percent_of": _percent,
    "derivative_at": _derivative,
    "linear_system": _system,
    "mean": _mean,
    "arithmetic_series": _series,
    "sqrt_simplify": _sqrt,
    "power": _power,
}


class MathDomain(Domain):
    family = "math"
    tier = "core"
    levels = (1, 2, 3)
    time_budget_s = 2.0

    def __init__(self, generator: str) -> None:
        self.name = f"math/{generator}"
        self.tags = ("math", "math_verify")
        self._gen = GENERATORS[generator]

    def generate(self, level: int, rng: random.Random) -> tuple[str, str, dict[str, Any]]:
        prompt, answer = self._gen(level, rng)
        return prompt, answer if isinstance(answer, str) else latex(answer), {}

    def extract(self, task: Task, response: str) -> str:
        return extract_answer(response, multiline=True)

    def max_answer_chars(self, task: Task) -> int:
        return MAX_CHARS

    def score(self, task: Task, answer: str) -> tuple[float, dict[str, Any]]:
        equal, parsable = math_equal(task.gold, answer)
        return float(equal), {"parsable": parsable}


def domains() -> list[Domain]:
    return [MathDomain(g) for g in GENERATORS]
