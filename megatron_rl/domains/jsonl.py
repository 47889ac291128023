"""Task sets without code: a domain defined by a JSONL file, and the held-out failures file.

Task file: one JSON object per line::

    {"prompt": "What is 2+2?", "gold": "4", "verifier": "numeric"}
    {"prompt": "Name a prime > 10", "gold": "11", "verifier": "regex", "pattern": "^(11|13|17)$"}

Keys: ``prompt`` and ``gold`` (required; gold must score 1), ``verifier`` (one of
:data:`VERIFIERS`, default ``exact``), ``pattern`` (regex), ``schema`` (JSON Schema), ``tests``
(``test_*`` functions for ``code_tests``; gold is then a reference program), ``source`` (for
``domain``: ``{"domain": NAME, "task": Task dict}``, scored by that installed domain's own
verifier), and optional ``domain`` (default ``tasks/<file stem>``), ``split`` (``train`` or
``eval``; default: by prompt hash, as for generated domains), ``level`` (default 0), ``id``.

Eval failures: the training loop appends one line per held-out task it scored below 1 to
``RUN_DIR/eval_failures.jsonl`` (:func:`append_eval_failures`); each line is
``{"step": int, "task": Task dict, "response": str, "score": float}``.
``megatron-rl domains export-failures RUN_DIR`` turns the tasks still failing at their latest
evaluation into a task file (:func:`export_failures`) with ``verifier: domain``, which feeds the
next run through ``domains.task_files``.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from megatron_rl.domains.base import (
    Domain,
    Task,
    VerifyResult,
    extract_answer,
    split_of,
    stable_int,
)
from megatron_rl.domains.verifiers import extract_code, math_equal, numbers_equal, score_program

VERIFIERS = ("exact", "regex", "numeric", "math", "json_schema", "code_tests", "domain")
FAILURES_FILE = "eval_failures.jsonl"


class JsonlDomain(Domain):
    """A finite task list; ``task(split, index)`` walks a seed-shuffled order of that split."""

    family = "tasks"
    tags = ("jsonl",)
    time_budget_s = 15.0

    def __init__(self, name: str, rows: list[dict[str, Any]], path: str) -> None:
        self.name = name
        self.path = path
        self.rows = rows
        self.levels = tuple(sorted({int(r.get("level", 0)) for r in rows}))
        self.splits = tuple(s for s in ("train", "eval") if any(r["split"] == s for r in rows))

    def task(self, split: str, index: int, level: int | None = None, seed: int = 0) -> Task:
        level = self.levels[0] if level is None else level
        rows = [r for r in self.rows if r["split"] == split and int(r.get("level", 0)) == level]
        if not rows:
            raise ValueError(f"{self.name} ({self.path}) has no {split} tasks at level {level}")
        order = list(range(len(rows)))
        random.Random(stable_int(self.name, split, level, seed)).shuffle(order)
        r = rows[order[index % len(rows)]]
        tid = r.get("id") or f"{self.name}:{split}:{level}:{stable_int(r['prompt']) % 16**12:012x}"
        meta = {k: v for k, v in r.items() if k not in ("prompt", "gold", "split", "level", "id")}
        return Task(self.name, split, level, str(tid), r["prompt"], r["gold"], meta)

    def prompt_counts(self, level: int) -> dict[str, int] | None:
        rows = [r for r in self.rows if int(r.get("level", 0)) == level]
        return {s: len({r["prompt"] for r in rows if r["split"] == s}) for s in self.splits}

    def max_answer_chars(self, task: Task) -> int:
        return (
            20_000
            if task.meta["verifier"] in ("code_tests", "domain")
            else super().max_answer_chars(task)
        )

    def extract(self, task: Task, response: str) -> str:
        if task.meta["verifier"] in ("code_tests", "domain"):
            return response  # handed whole to the code / source-domain extraction
        return extract_answer(response, multiline="\n" in task.gold.strip())

    def score(self, task: Task, answer: str) -> tuple[float, dict[str, Any]]:
        kind = task.meta["verifier"]
        if kind == "exact":
            return float(answer.strip() == task.gold.strip()), {}
        if kind == "regex":
            return float(re.fullmatch(task.meta["pattern"], answer.strip()) is not None), {}
        if kind == "numeric":
            ok, parsable = numbers_equal(task.gold, answer)
            return float(ok), {"parsable": parsable}
        if kind == "math":
            ok, parsable = math_equal(task.gold, answer)
            return float(ok), {"parsable": parsable}
        if kind == "json_schema":
            import jsonschema

            try:
                jsonschema.validate(json.loads(answer), task.meta["schema"])
            except (ValueError, jsonschema.ValidationError):
                return 0.0, {}
            return 1.0, {}
        if kind == "code_tests":
            return score_program(extract_code(answer), task.meta["tests"])
        return self._score_by_source(task, answer)

    def _score_by_source(self, task: Task, answer: str) -> tuple[float, dict[str, Any]]:
        from megatron_rl.domains.registry import registry

        src = task.meta["source"]
        res: VerifyResult = (
            registry().domains[src["domain"]].verify(Task.from_dict(src["task"]), answer)
        )
        details = {"parsable": res.parsable, "source": src["domain"], **res.details}
        if res.error:  # the source's verifier could not judge (e.g. no sandbox): neither can we
            details["verifier_error"] = res.error
        return res.score, details


def _check_row(row: Any, where: str) -> dict[str, Any]:
    if not isinstance(row, dict) or "prompt" not in row or "gold" not in row:
        raise ValueError(f"{where}: each line must be a JSON object with 'prompt' and 'gold'")
    row.setdefault("verifier", "exact")
    need = {"regex": "pattern", "json_schema": "schema", "code_tests": "tests", "domain": "source"}
    if row["verifier"] not in VERIFIERS:
        raise ValueError(f"{where}: verifier {row['verifier']!r} is not one of {list(VERIFIERS)}")
    if row["verifier"] in need and need[row["verifier"]] not in row:
        raise ValueError(
            f"{where}: verifier {row['verifier']!r} needs key {need[row['verifier']]!r}"
        )
    row.setdefault("split", split_of(row["prompt"]))
    if row["split"] not in ("train", "eval"):
        raise ValueError(f"{where}: split must be 'train' or 'eval', got {row['split']!r}")
    return row


def domains_from_files(paths: Iterable[str]) -> list[Domain]:
    """One domain per distinct ``domain`` value in the files (default ``tasks/<stem>``)."""
    groups: dict[str, list[dict[str, Any]]] = {}
    origin: dict[str, str] = {}
    for path in paths:
        p = Path(path)
        if not p.is_file():
            raise ValueError(f"task file {path!r} does not exist")
        for i, line in enumerate(p.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{i}: not valid JSON ({e.msg})") from None
            row = _check_row(row, f"{path}:{i}")
            name = row.pop("domain", f"tasks/{p.stem}")
            groups.setdefault(name, []).append(row)
            origin.setdefault(name, str(p))
    return [JsonlDomain(n, rows, origin[n]) for n, rows in sorted(groups.items())]


def append_eval_failures(
    run_dir: str | Path, step: int, failures: Sequence[tuple[Task, str, float]]
) -> None:
    """Append held-out ``(task, response, score)`` results to ``RUN_DIR/eval_failures.jsonl``.

    The loop passes every eval result it scored below 1 (and may pass successes too, so a task
    fixed later is not exported: only the latest score per task id counts).
    """
    path = Path(run_dir) / FAILURES_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        for task, response, score in failures:
            rec = {
                "step": step,
                "task": task.to_dict(),
                "response": response[:4000],
                "score": score,
            }
            f.write(json.dumps(rec, default=str) + "\n")


def export_failures(run_dir: str | Path, out: str | Path, threshold: float = 1.0) -> int:
    """Write the tasks whose latest eval score is below ``threshold`` as a task file; count."""
    src = Path(run_dir) / FAILURES_FILE
    if not src.is_file():
        raise ValueError(f"{src} does not exist: the run recorded no held-out eval results")
    latest: dict[str, dict[str, Any]] = {}
    for i, line in enumerate(src.read_text().splitlines(), 1):
        if line.strip():
            try:
                rec = json.loads(line)
                latest[rec["task"]["id"]] = rec
            except (json.JSONDecodeError, KeyError, TypeError):
                raise ValueError(f"{src}:{i}: not an eval-failure record") from None
    rows = [
        {
            "domain": f"failures/{r['task']['domain']}",
            "prompt": r["task"]["prompt"],
            "gold": r["task"]["gold"],
            "verifier": "domain",
            "split": "train",
            "level": r["task"]["level"],
            "id": r["task"]["id"],
            "source": {"domain": r["task"]["domain"], "task": r["task"]},
        }
        for r in latest.values()
        if float(r["score"]) < threshold
    ]
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text("".join(json.dumps(r, default=str) + "\n" for r in rows))
    return len(rows)
