"""The contract every registered domain must pass (``megatron-rl domains check``, and CI).

For each checked level (the easiest and the hardest) and ``samples`` task indices:

1. determinism: the same ``(split, index, level, seed)`` gives the same task twice;
2. train and eval are disjoint: no prompt appears in both samples, and each task carries the
   split it was asked for;
3. the gold answer scores 1, bare and wrapped in ``<answer>`` tags;
4. garbage, empty, huge (1 MB) and unicode-noise answers score 0, and ``verify`` returns
   (it never raises by construction; an internal error would show as a 0 with a reason);
5. every ``verify`` call stays under the family's ``time_budget_s``;
6. multi-turn domains: replaying ``task.meta["gold_actions"]`` through ``env`` ends the episode
   and its last turn verifies to 1.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

from megatron_rl.domains.base import Domain, Task

_NOISE_RANGES = [(0x4E00, 0x9FFF), (0x1F300, 0x1F5FF), (0x0300, 0x036F), (0x0400, 0x04FF)]


def _unicode_noise(n: int = 400) -> str:
    rng = random.Random(0)
    return "".join(chr(rng.randint(*rng.choice(_NOISE_RANGES))) for _ in range(n))


BAD_ANSWERS: dict[str, str] = {
    "garbage": "zzq blorf wibble <<>> ::: quux",
    "empty": "",
    "huge": "lorem ipsum dolor sit amet " * (1_000_000 // 27 + 1),  # ~1 MB
    "unicode_noise": _unicode_noise(),
}


@dataclass
class CheckReport:
    name: str
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0
    max_verify_s: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.failures


def _verify_timed(d: Domain, task: Task, answer: str, report: CheckReport, what: str) -> float:
    res = d.verify(task, answer)
    report.max_verify_s = max(report.max_verify_s, res.duration_s)
    if res.duration_s > d.time_budget_s:
        report.failures.append(
            f"{what}: verify took {res.duration_s:.2f}s > budget {d.time_budget_s}s ({task.id})"
        )
    return res.score


def _check_task(d: Domain, task: Task, report: CheckReport) -> None:
    if task.split != task.split.strip() or task.domain != d.name:
        report.failures.append(f"task {task.id} has domain {task.domain!r} != {d.name!r}")
    golds = [task.gold] if d.multi_turn else [task.gold, f"<answer>{task.gold}</answer>"]
    for g in golds:
        if (s := _verify_timed(d, task, g, report, "gold")) != 1.0:
            why = d.verify(task, g).details
            report.failures.append(f"gold scored {s} on {task.id}: {str(why)[:200]}")
    for kind, answer in BAD_ANSWERS.items():
        if (s := _verify_timed(d, task, answer, report, kind)) != 0.0:
            report.failures.append(f"{kind} answer scored {s} on {task.id}")
    if d.multi_turn:
        _check_episode(d, task, report)


def _check_episode(d: Domain, task: Task, report: CheckReport) -> None:
    actions = task.meta.get("gold_actions") or []
    if not actions:
        report.failures.append(f"multi-turn task {task.id} has no meta['gold_actions']")
        return
    env = d.env(task)
    obs = None
    for turn in actions:
        obs = env.step(turn)
    if obs is None or not obs.done:
        report.failures.append(f"episode of {task.id} not done after its gold actions")
    elif d.verify(task, actions[-1]).score != 1.0:
        report.failures.append(f"episode of {task.id}: last gold action does not verify")


def check_domain(d: Domain, samples: int = 3, seed: int = 0) -> CheckReport:
    """Run the contract on ``d`` and return what failed (empty ``failures`` = pass)."""
    report = CheckReport(d.name)
    start = time.perf_counter()
    levels = sorted({d.levels[0], d.levels[-1]})
    try:
        for level in levels:
            prompts: dict[str, set[str]] = {}
            for split in d.splits:
                prompts[split] = set()
                for i in range(samples):
                    task = d.task(split, i, level, seed)
                    if task != d.task(split, i, level, seed):
                        report.failures.append(f"{split}[{i}] level {level} not deterministic")
                    if task.split != split:
                        report.failures.append(f"{split}[{i}] came back as split {task.split}")
                    prompts[split].add(task.prompt)
                    _check_task(d, task, report)
            if len(prompts) == 2 and prompts["train"] & prompts["eval"]:
                report.failures.append(f"level {level}: train and eval share a prompt")
    except Exception as e:  # generation itself failed: a contract failure, reported by name
        report.failures.append(f"task generation raised {type(e).__name__}: {e}")
    report.seconds = time.perf_counter() - start
    return report


def check_domains(domains: dict[str, Domain], samples: int = 3, seed: int = 0) -> list[CheckReport]:
    return [check_domain(d, samples, seed) for d in domains.values()]
