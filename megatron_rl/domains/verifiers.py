"""Answer checkers shared by the library and the plugin domains.

The JSONL task sets of the library (``megatron_rl/domains/jsonl.py``: ``verifier: numeric``,
``math``, ``code_tests``) and the procedural plugin domains (``domains/math_tasks.py``,
``domains/tool_use.py``, ``domains/code.py``) score answers with the same functions; they live
here so that the library never imports the plugin package (plugins import the library).

Timeouts of :func:`math_equal` (answers only; golds are trusted and parsed without one):
``math-verify`` bounds parsing and comparison with ``signal.alarm``, which only works in a
process's main thread. The timeouts are passed only on
the main thread (inline scoring, and the verifier pool's worker processes, whose tasks run on
their main thread); on any other thread they are disabled, relying on a domain's answer length
cap (``MATH_MAX_CHARS``: longer answers never reach the parser) to bound the work.
"""

from __future__ import annotations

import functools
import re
import threading
from typing import Any

from megatron_rl.domains.base import extract_answer
from megatron_rl.domains.code_exec import ExecResult, run_tests

MATH_MAX_CHARS = 4000  # longer math answers are unparsable without calling the parser
MATH_TIMEOUT_S = 3  # math-verify parse/verify timeout (main thread only)
RUN_TIMEOUT_S = 10.0  # wall-clock limit of one test run (generous: CI shares 2 busy cores)
_FENCE = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.DOTALL)


def math_equal(gold: str, answer: str) -> tuple[bool, bool]:
    """(equal, parsable) of a LaTeX gold and a free-form answer, via math-verify."""
    from math_verify import parse, verify

    t = MATH_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
    g = _parse_gold(gold)
    bare_latex = "\\" in answer and "$" not in answer and "\\boxed" not in answer
    # bare LaTeX ("3\\sqrt{7}") is only read whole inside $...$; plain text parses as is
    p = parse(f"${answer}$" if bare_latex else answer, parsing_timeout=t)
    if not p:
        return False, False
    return bool(verify(g, p, timeout_seconds=t)), True


@functools.lru_cache(maxsize=4096)
def _parse_gold(gold: str) -> Any:
    """A gold answer parsed without a timeout: golds come from the task sets (trusted, short),
    and the first parse in a process also loads math-verify's grammar, which took over
    ``MATH_TIMEOUT_S`` of wall time on a loaded machine and turned a right answer's reward into
    0. Cached: a group's answers share their gold."""
    from math_verify import parse

    return parse(f"${gold}$", parsing_timeout=None)


def numbers_equal(gold: str, answer: str) -> tuple[bool, bool]:
    """(equal, parsable) of two decimal numbers, relative tolerance 1e-6 (commas ignored)."""
    try:
        value = float(answer.replace(",", "").strip())
    except ValueError:
        return False, False
    return abs(value - float(gold)) <= 1e-6 * max(1.0, abs(float(gold))), True


def extract_code(response: str) -> str:
    """The last fenced Python block of a response, else its ``<answer>`` / whole text."""
    blocks = _FENCE.findall(response)
    return str(blocks[-1]) if blocks else extract_answer(response, multiline=True)


def score_program(program: str, tests: str) -> tuple[float, dict[str, Any]]:
    """1.0 when ``program`` passes ``tests`` in the sandbox; details name the status. When no
    sandbox could run it, details carry ``verifier_error``: the verdict is not the program's and
    the run counts it as a failed verification (megatron_rl/domains/guard.py), not a 0 reward."""
    try:
        compile(program, "program.py", "exec")
        compiles = 1.0
    except (SyntaxError, ValueError):
        return 0.0, {
            "parsable": False,
            "status": "syntax_error",
            "process_scores": {"compiles": 0.0},
        }
    res = run_tests(program, tests, timeout_s=RUN_TIMEOUT_S, memory_mb=512)
    details = {
        "status": res.status,
        "stderr": res.stderr[-300:],
        "process_scores": {"compiles": compiles},
    }
    if isinstance(res, ExecResult) and res.sandbox_error:
        details["verifier_error"] = f"no sandbox: {res.sandbox_error}"
    return (1.0 if res.status == "passed" else 0.0), details
