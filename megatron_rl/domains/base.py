"""The domain abstraction: a deterministic source of tasks plus a verifier that never raises.

A :class:`Domain` turns ``(split, index, level, seed)`` into a :class:`Task` and scores a model
response against it with :meth:`Domain.verify`, returning a :class:`VerifyResult`.

Determinism and train/eval disjointness
    Every task is drawn from a ``random.Random`` seeded with a SHA-256 of
    ``(domain, split, seed, level, index, attempt)``, so the same arguments give the same task in
    any process. Splits are disjoint *by content*, not only by seed stream: a task belongs to the
    held-out split iff the hash of its prompt falls in the eval bucket (1 in ``EVAL_BUCKETS``).
    ``task()`` draws candidates (attempt 0, 1, ...) until one lands in the requested split (a
    draw whose generator raises is skipped, up to ``MAX_GENERATE_ERRORS``). A
    generator with a tiny problem space therefore can never leak an eval prompt into training,
    which disjoint seeds alone would not guarantee (e.g. "3 + 4 = ?" reappears under any seed).

Answer extraction
    If the response holds ``<answer>...</answer>`` the last such block is the answer; otherwise
    the stripped response, cut to its first line unless the task's gold spans several lines.
    Answers longer than ``max_answer_chars`` are unparsable (score 0) and never reach a parser:
    this bounds verifier time on 1 MB outputs.

Multi-turn domains set ``multi_turn = True`` and implement :meth:`Domain.env`; see
``docs/domains.md`` for the transcript format.
"""

from __future__ import annotations

import hashlib
import random
import re
import time
from dataclasses import dataclass, field
from typing import Any, Literal

Split = Literal["train", "eval"]
Tier = Literal["core", "long_tail"]
SPLITS: tuple[str, ...] = ("train", "eval")
EVAL_BUCKETS = 4  # one prompt hash bucket in EVAL_BUCKETS is held out for eval
MAX_ATTEMPTS = 256  # candidates drawn per task before the generator is declared too small
MAX_GENERATE_ERRORS = 8  # generator exceptions tolerated per task (skipped draws) before raising
_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)


@dataclass(frozen=True)
class Task:
    """One problem. ``prompt`` is the user message; ``gold`` a reference answer scoring 1."""

    domain: str  # name of the domain that made it (travels to rewards and metrics)
    split: str  # "train" or "eval"
    level: int  # difficulty level (one of the domain's levels)
    id: str  # stable id: hash of domain, split, level and prompt
    prompt: str  # the user message
    gold: str  # a reference answer; verify(task, gold) scores 1.0
    meta: dict[str, Any] = field(default_factory=dict)  # generator data the verifier needs

    def to_dict(self) -> dict[str, Any]:
        return {
            "domain": self.domain,
            "split": self.split,
            "level": self.level,
            "id": self.id,
            "prompt": self.prompt,
            "gold": self.gold,
            "meta": self.meta,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Task:
        return cls(
            **{k: d[k] for k in ("domain", "split", "level", "id", "prompt", "gold")},
            meta=d.get("meta", {}),
        )


@dataclass
class VerifyResult:
    """The verdict on one response. ``score`` is in [0, 1]."""

    score: float  # outcome score in [0, 1]
    parsable: bool  # an answer could be extracted and parsed
    details: dict[str, Any] = field(default_factory=dict)  # for logs: extracted answer, reason
    process_scores: dict[str, float] = field(default_factory=dict)  # optional, each in [0, 1]
    hard_violation: bool = False  # broke a hard constraint (safety): trainer applies a floor
    violations: tuple[str, ...] = ()  # constraints broken (megatron_rl/rewards/constraints.py):
    # "hard_violation" when that is set, and the names score() lists in details["violations"]
    duration_s: float = 0.0  # wall time the verification took
    error: str = ""  # why the verifier could not judge at all (its machinery failed, e.g. no
    # sandbox for code; ``score`` sets details["verifier_error"]): "" for a real verdict. The run
    # counts such a result as a failed verification and never rewards it (domains/guard.py)


@dataclass(frozen=True)
class RewardWeights:
    """Per-domain weights of the reward terms (``reward.py``: :func:`~.reward.compose_reward`)."""

    outcome: float = 1.0  # weight of the verifier's outcome score (in [0, 1])
    process: dict[str, float] = field(default_factory=dict)  # weight per process score name
    format_penalty: float = 0.0  # subtracted when no answer could be parsed
    length_penalty: float = 0.0  # subtracted per 1,000 chars over length_budget_chars
    length_budget_chars: int = 8000  # response length (chars) before the length penalty starts
    hard_floor: float = -1.0  # reward when the verdict has hard_violation set

    def __hash__(self) -> int:  # frozen dataclass with a dict field: hash by value
        return hash(
            (
                self.outcome,
                tuple(sorted(self.process.items())),
                self.format_penalty,
                self.length_penalty,
                self.length_budget_chars,
                self.hard_floor,
            )
        )


@dataclass
class Observation:
    """What a multi-turn environment returns after a model turn."""

    text: str  # environment message (masked out of the loss by the trainer)
    done: bool  # the episode is over; the last model turn holds the final answer


class Env:
    """A multi-turn episode. ``step`` takes the model's turn and returns the environment's."""

    def step(self, model_turn: str) -> Observation:
        raise NotImplementedError


def stable_int(*parts: Any) -> int:
    """A 63-bit integer from a SHA-256 of ``parts`` (same in every process, unlike ``hash``)."""
    digest = hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def split_of(prompt: str) -> str:
    """The split a prompt belongs to, decided by its content hash alone."""
    return "eval" if stable_int("split", prompt) % EVAL_BUCKETS == 0 else "train"


def extract_answer(response: str, multiline: bool = False) -> str:
    """The answer inside the last ``<answer>`` block, else the stripped (first line of) response."""
    blocks = _ANSWER_RE.findall(response)
    if blocks:
        return str(blocks[-1]).strip()
    text = response.strip()
    if not multiline:
        text = text.split("\n", 1)[0].strip()
    return text


class Domain:
    """Base class. Subclasses implement :meth:`generate` and :meth:`score`.

    Class attributes describe the domain; instances may override them in ``__init__``.
    """

    name: str = ""  # "<family>/<generator>[@level]"
    family: str = ""  # one of the plugin families (rg, math, code, tool, long_context, ...)
    group: str = ""  # domains that are levels of one generator share it (rg); "" = own name
    tier: Tier = "long_tail"  # "core" domains get a guaranteed share of the mix
    tags: tuple[str, ...] = ()
    levels: tuple[int, ...] = (0,)  # difficulty levels, easy -> hard
    splits: tuple[str, ...] = SPLITS  # splits it has tasks for (task files may hold one only)
    multi_turn: bool = False  # True: episodes run through env(task)
    time_budget_s: float = 1.0  # contract: max seconds to verify one answer
    plugin: str = ""  # entry point that registered the domain (set by the registry)
    reward_weights: RewardWeights = RewardWeights()
    constraints: tuple[str, ...] = ()  # constraints its samples can violate: their violation
    # rates (rewards.constraints) count its samples (megatron_rl/rewards/constraints.py)

    # -- to implement ------------------------------------------------------------------------

    def generate(self, level: int, rng: random.Random) -> tuple[str, str, dict[str, Any]]:
        """Make one candidate task: ``(prompt, gold, meta)`` from ``rng`` alone."""
        raise NotImplementedError

    def score(self, task: Task, answer: str) -> tuple[float, dict[str, Any]]:
        """Score an extracted, length-checked answer. May raise: :meth:`verify` catches."""
        raise NotImplementedError

    # -- provided ----------------------------------------------------------------------------

    def extract(self, task: Task, response: str) -> str:
        return extract_answer(response, multiline="\n" in task.gold.strip())

    def max_answer_chars(self, task: Task) -> int:
        return max(4 * len(task.gold), 2000)

    def prompt_counts(self, level: int) -> dict[str, int] | None:
        """Exact distinct prompts per split at ``level`` where the domain knows them (a finite
        task list); None for generators, whose spaces ``domains check`` estimates instead."""
        return None

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "family": self.family,
            "group": self.group or self.name,
            "tier": self.tier,
            "tags": list(self.tags),
            "levels": list(self.levels),
            "difficulty": [min(self.levels), max(self.levels)],
            "multi_turn": self.multi_turn,
            "plugin": self.plugin,
        }

    def task(self, split: str, index: int, level: int | None = None, seed: int = 0) -> Task:
        """The ``index``-th task of ``split`` at ``level`` for ``seed``; deterministic."""
        if split not in SPLITS:
            raise ValueError(f"split={split!r} is not allowed; choose one of {list(SPLITS)}")
        level = self.levels[0] if level is None else level
        if level not in self.levels:
            raise ValueError(f"level={level} is not a level of {self.name}; allowed: {self.levels}")
        errors: list[Exception] = []
        for attempt in range(MAX_ATTEMPTS):
            rng = random.Random(stable_int(self.name, split, seed, level, index, attempt))
            try:
                prompt, gold, meta = self.generate(level, rng)
            except Exception as e:  # some generators fail for some seeds: skip that draw
                errors.append(e)
                if len(errors) >= MAX_GENERATE_ERRORS:
                    raise RuntimeError(
                        f"{self.name} level {level}: generator failed "
                        f"{len(errors)} times, last: {e!r}"
                    ) from e
                continue
            if split_of(prompt) == split:
                tid = f"{self.name}:{split}:{level}:{stable_int(prompt) % 16**12:012x}"
                return Task(self.name, split, level, tid, prompt, gold, meta)
        raise RuntimeError(
            f"{self.name} level {level}: no {split} task in {MAX_ATTEMPTS} draws "
            "(problem space too small to hold out an eval split)"
        )

    def verify(self, task: Task, response: str) -> VerifyResult:
        """Score ``response`` for ``task``. Never raises; unparsable output scores 0."""
        start = time.perf_counter()
        try:
            if not isinstance(response, str):
                raise TypeError(f"response must be str, got {type(response).__name__}")
            answer = self.extract(task, response)
            if not answer:
                result = VerifyResult(0.0, False, {"reason": "empty answer"})
            elif len(answer) > self.max_answer_chars(task):
                result = VerifyResult(0.0, False, {"reason": f"answer over {len(answer)} chars"})
            else:
                score, details = self.score(task, answer)
                parsable = bool(details.pop("parsable", True))
                details.setdefault("answer", answer[:200])
                result = VerifyResult(min(1.0, max(0.0, float(score))), parsable, details)
                result.process_scores = details.pop("process_scores", {})
                result.hard_violation = bool(details.pop("hard_violation", False))
                result.error = str(details.pop("verifier_error", ""))
                named = {str(v) for v in details.pop("violations", ())}
                named |= {"hard_violation"} if result.hard_violation else set()
                result.violations = tuple(sorted(named))
        except Exception as e:  # verifier bug or hostile input: score 0, keep the reason
            result = VerifyResult(
                0.0, False, {"reason": f"verifier error: {type(e).__name__}: {e}"}
            )
        result.duration_s = time.perf_counter() - start
        return result

    def env(self, task: Task) -> Env:
        raise TypeError(f"{self.name} is single-turn; it has no env()")

    def __repr__(self) -> str:
        return f"<Domain {self.name} family={self.family} levels={list(self.levels)}>"
