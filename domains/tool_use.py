"""Tool-use domains: multi-turn episodes where the model calls a calculator or queries SQLite.

Transcript format (also in ``docs/domains.md``). The user message is ``task.prompt``. Each model
turn is either a tool call or a final answer::

    <tool>calculator: (48213 * 9127 - 3312) / 4</tool>
    <tool>sql: SELECT SUM(quantity) FROM orders WHERE product = 'lamp'</tool>
    <answer>110012</answer>

``env.step(turn)`` answers a tool call with ``Observation("<result>...</result>", done=False)``
(the rollout appends it as an environment message whose tokens the trainer masks out of the
loss), a final answer with ``done=True``, and anything else with a reminder of the format. After
``MAX_TURNS`` model turns the episode ends. The verifier only reads the final ``<answer>``:
``verify(task, last_model_turn)``; numbers compare within 1e-6.

- ``tool/calculator``: arithmetic too long to do reliably in one's head; the calculator
  evaluates + - * / // % ** and parentheses on numbers (an AST walk, no ``eval``).
- ``tool/sqlite``: a real in-memory SQLite database (``orders`` table, rows generated from the
  task's seed, 20/100/500 rows by level) that only the tool can see; the prompt gives the schema
  and a question answered by one aggregate query. The connection is read-only
  (``PRAGMA query_only``) and queries are aborted after ``SQL_STEPS`` VM steps.
"""

from __future__ import annotations

import ast
import operator
import random
import re
import sqlite3
from typing import Any

from megatron_rl.domains.base import Domain, Env, Observation, Task, extract_answer
from megatron_rl.domains.verifiers import numbers_equal

MAX_TURNS = 6  # model turns per episode
SQL_STEPS = 2_000_000  # SQLite VM steps before a query is aborted
_TOOL = re.compile(r"<tool>\s*(\w+)\s*:(.*?)</tool>", re.DOTALL)
_OPS: dict[type, Any] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}
PRODUCTS = ["lamp", "chair", "desk", "shelf", "rug", "mirror", "clock", "vase"]
CUSTOMERS = ["ana", "ben", "chen", "dara", "eli", "fay", "gus", "hana", "ivo", "jun"]


def calculate(expr: str) -> float:
    """Evaluate an arithmetic expression safely (numbers and + - * / // % ** only)."""

    def ev(node: ast.AST) -> Any:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > 64:
                raise ValueError("exponent too large")
            return _OPS[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.operand))
        raise ValueError(f"unsupported expression element {type(node).__name__}")

    return float(ev(ast.parse(expr.strip()[:500], mode="eval")))


def fmt_number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:.6f}".rstrip("0")


def build_db(seed: int, rows: int) -> sqlite3.Connection:
    """The task's database: ``orders(id, customer, product, quantity, price)``, read-only."""
    rng = random.Random(seed)
    con = sqlite3.connect(":memory:", check_same_thread=False)
    con.execute(
        "CREATE TABLE orders (id INTEGER PRIMARY KEY, customer TEXT, product TEXT, "
        "quantity INTEGER, price REAL)"
    )
    con.executemany(
        "INSERT INTO orders VALUES (?, ?, ?, ?, ?)",
        [
            (
                i,
                rng.choice(CUSTOMERS),
                rng.choice(PRODUCTS),
                rng.randint(1, 20),
                rng.randint(100, 9999) / 100,
            )
            for i in range(1, rows + 1)
        ],
    )
    con.execute("PRAGMA query_only = ON")
    return con


class ToolEnv(Env):
    """One episode: dispatches tool calls to the task's calculator / database."""

    def __init__(self, task: Task) -> None:
        self.task = task
        self.turns = 0
        self.db = (
            build_db(task.meta["db_seed"], task.meta["rows"]) if "db_seed" in task.meta else None
        )

    def step(self, model_turn: str) -> Observation:
        self.turns += 1
        call = _TOOL.search(model_turn)
        if call is None and "<answer>" in model_turn.lower():
            return Observation("", True)
        if call is None:
            text = "Call a tool with <tool>NAME: INPUT</tool> or answer with <answer>...</answer>."
        else:
            text = f"<result>{self._run(call.group(1).lower(), call.group(2).strip())}</result>"
        return Observation(text, self.turns >= MAX_TURNS)

    def _run(self, tool: str, arg: str) -> str:
        try:
            if tool == "calculator":
                return fmt_number(calculate(arg))
            if tool == "sql" and self.db is not None:
                ticks = iter(range(SQL_STEPS // 1000))  # handler runs every 1000 VM steps
                self.db.set_progress_handler(lambda: next(ticks, None) is None, 1000)
                rows = self.db.execute(arg).fetchmany(50)
                return "\n".join(", ".join(str(v) for v in r) for r in rows) or "(no rows)"
            return f"error: unknown tool {tool!r}"
        except Exception as e:  # tool errors are observations, not crashes
            return f"error: {type(e).__name__}: {e}"[:300]


class ToolDomain(Domain):
    family = "tool"
    tier = "core"
    levels = (1, 2, 3)
    multi_turn = True
    time_budget_s = 1.0

    def __init__(self, tool: str) -> None:
        self.tool = tool
        self.name = f"tool/{tool}"
        self.tags = ("tool_use", "multi_turn", tool)

    def generate(self, level: int, rng: random.Random) -> tuple[str, str, dict[str, Any]]:
        return self._calculator(level, rng) if self.tool == "calculator" else self._sql(level, rng)

    def _calculator(self, level: int, rng: random.Random) -> tuple[str, str, dict[str, Any]]:
        nums = [rng.randint(10 ** (level + 2), 10 ** (level + 3)) for _ in range(level + 2)]
        ops = [rng.choice(["+", "-", "*"]) for _ in nums[1:]]
        expr = str(nums[0]) + "".join(f" {o} {n}" for o, n in zip(ops, nums[1:], strict=True))
        expr = f"({expr}) / {rng.choice([2, 4, 5, 8])}"
        gold = fmt_number(calculate(expr))
        prompt = (
            f"Compute {expr}. You can call <tool>calculator: EXPRESSION</tool>; "
            "give the final result as <answer>NUMBER</answer>."
        )
        return (
            prompt,
            gold,
            {"gold_actions": [f"<tool>calculator: {expr}</tool>", f"<answer>{gold}</answer>"]},
        )

    def _sql(self, level: int, rng: random.Random) -> tuple[str, str, dict[str, Any]]:
        seed, rows = rng.randrange(2**31), {1: 20, 2: 100, 3: 500}[level]
        product, customer = rng.choice(PRODUCTS), rng.choice(CUSTOMERS)
        question, query = rng.choice(
            [
                (
                    f"How many units of {product} were ordered in total?",
                    f"SELECT COALESCE(SUM(quantity), 0) FROM orders WHERE product = '{product}'",
                ),
                (
                    f"How many orders did {customer} place?",
                    f"SELECT COUNT(*) FROM orders WHERE customer = '{customer}'",
                ),
                (
                    f"What is the highest price paid for {product} (0 if never ordered)?",
                    f"SELECT COALESCE(MAX(price), 0) FROM orders WHERE product = '{product}'",
                ),
            ]
        )
        gold = fmt_number(float(build_db(seed, rows).execute(query).fetchone()[0]))
        prompt = (
            "A SQLite database has a table orders(id INTEGER, customer TEXT, product TEXT, "
            f"quantity INTEGER, price REAL). {question} Query it with <tool>sql: QUERY</tool>; "
            "give the final result as <answer>NUMBER</answer>."
        )
        meta = {
            "db_seed": seed,
            "rows": rows,
            "gold_actions": [f"<tool>sql: {query}</tool>", f"<answer>{gold}</answer>"],
        }
        return prompt, gold, meta

    def env(self, task: Task) -> Env:
        return ToolEnv(task)

    def score(self, task: Task, answer: str) -> tuple[float, dict[str, Any]]:
        equal, parsable = numbers_equal(task.gold, answer)
        return float(equal), {"parsable": parsable}

    def extract(self, task: Task, response: str) -> str:
        return extract_answer(response)


def domains() -> list[Domain]:
    return [ToolDomain("calculator"), ToolDomain("sqlite")]
