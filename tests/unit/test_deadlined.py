"""Start-up of the model-based rewards (megatron_rl/rewards/service.py ``Deadlined``): the start
runs inside the batch's deadline (a hung or slow one is a counted ``timeout``, the late backend
stopped), and a failed start-up is retried with back-off (the batches in between counted
``dead`` at once), for the judge and the reward model alike. The backends here are fakes whose
``make`` hangs, sleeps or raises: nothing else here could make a start-up misbehave on cue."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from megatron_rl.domains.base import Task
from megatron_rl.model.tokenizer import load_tokenizer
from megatron_rl.rewards.judge import Judge, JudgeConfig
from megatron_rl.rewards.reward_model import RewardModel, RewardModelConfig
from megatron_rl.rollout.base import Completion

ROOT = Path(__file__).resolve().parents[2]
TASK = Task("d/x", "train", 0, "id", "What is 2 + 2?", "4")
ITEMS = [(TASK, "4"), (TASK, "5"), (TASK, "6")]


class Engine:
    """A judge engine that answers ``reply`` to every request; a scorer that scores 1.0."""

    def __init__(self, reply: str = "7") -> None:
        self.reply, self.killed, self.closed = reply, False, False

    def generate(self, reqs: list[Any]) -> list[list[Completion]]:
        return [[Completion([5], self.reply, [0.0], "stop")] for _ in reqs]

    def score(self, texts: list[str]) -> list[float]:
        return [1.0] * len(texts)

    def kill(self) -> None:
        self.killed = True

    def shutdown(self) -> None:
        self.closed = True


class Make:
    """A ``make`` that, call by call, follows ``plan``: 'raise', 'hang' (until released),
    a float (sleep that long, then start), or 'ok'. Records every call and every backend."""

    def __init__(self, plan: list[Any]) -> None:
        self.plan, self.calls = list(plan), 0
        self.made: list[Engine] = []
        self.release = threading.Event()

    def __call__(self) -> Engine:
        step = self.plan[min(self.calls, len(self.plan) - 1)]
        self.calls += 1
        if step == "raise":
            raise ConnectionRefusedError("judge server refused the connection")
        if step == "hang":
            self.release.wait(30)
        elif isinstance(step, float):
            time.sleep(step)
        e = Engine()
        self.made.append(e)
        return e


def judge(make: Make, **cfg: Any) -> Judge:
    tok = load_tokenizer(str(ROOT / "models" / "tiny-base"))
    return Judge(JudgeConfig(model="m", domains=["d/*"], **cfg), 0, make, tokenizer=tok)


def reward_model(make: Make, **cfg: Any) -> RewardModel:
    return RewardModel(RewardModelConfig(server="http://x:1", domains=["*"], **cfg), make)


SCORERS = [judge, reward_model]


@pytest.mark.parametrize("scorer", SCORERS)
def test_a_hung_start_up_is_a_timeout_within_the_deadline_and_the_late_backend_is_stopped(
    scorer,
) -> None:
    make = Make(["hang", "ok"])
    s = scorer(make, timeout_s=0.4)
    t0 = time.monotonic()
    assert s.score(ITEMS) == ["timeout"] * 3
    assert time.monotonic() - t0 < 1.0  # the deadline, not the start-up, ended the batch
    assert s.failures["timeout"] == 3 and s.metrics()[f"{s.prefix}/start_failures"] == 1
    make.release.set()  # the hung start-up finishes after its batch gave up on it
    deadline = time.monotonic() + 5
    while not make.made and time.monotonic() < deadline:
        time.sleep(0.01)
    assert make.made and make.made[0].killed  # never used, stopped at once
    t0 = time.monotonic()
    assert s.score(ITEMS) == ["dead"] * 3  # backing off: no start tried, nothing waited
    assert time.monotonic() - t0 < 0.1 and make.calls == 1
    assert s.failures["dead"] == 3 and s.metrics()[f"{s.prefix}/start_skipped"] == 1
    good = s.score(ITEMS)  # the next start works
    assert all(isinstance(x, float) for x in good) and s.scored == 3 and make.calls == 2
    assert not make.made[1].killed


@pytest.mark.parametrize("scorer", SCORERS)
def test_a_slow_start_up_counts_against_the_deadline_unless_start_timeout_allows(
    scorer,
) -> None:
    slow = scorer(Make([0.6]), timeout_s=0.3)
    t0 = time.monotonic()
    assert slow.score(ITEMS[:1]) == ["timeout"]
    assert time.monotonic() - t0 < 0.55
    allowed = scorer(Make([0.6]), timeout_s=0.3, start_timeout_s=2.0)
    t0 = time.monotonic()
    got = allowed.score(ITEMS[:1])
    assert isinstance(got[0], float) and 0.55 < time.monotonic() - t0 < 2.3
    t0 = time.monotonic()
    assert isinstance(allowed.score(ITEMS[:1])[0], float)  # running: no start-up to wait for
    assert time.monotonic() - t0 < 0.3


@pytest.mark.parametrize("scorer", SCORERS)
def test_failed_start_ups_back_off_exponentially_and_a_good_batch_ends_it(scorer) -> None:
    make = Make(["raise"] * 4 + ["ok"])
    s = scorer(make, timeout_s=5.0)
    s.max_skip = 4
    t0 = time.monotonic()
    tried, results = [], []
    for _ in range(20):
        before = make.calls
        results.append(s.score(ITEMS[:2]))
        tried.append(make.calls > before)
    assert time.monotonic() - t0 < 2.0  # no batch waited on the dead backend
    # starts on batches 0, 2, 5, 10, 15 (skips 1, 2, 4, then capped at 4), 20 in all
    assert [i for i, t in enumerate(tried) if t] == [0, 2, 5, 10, 15]
    assert all(r == ["dead", "dead"] for r in results[:15])
    assert all(isinstance(x, float) for r in results[15:] for x in r)
    m = s.metrics()
    assert m[f"{s.prefix}/start_failures"] == 4 and m[f"{s.prefix}/start_skipped"] == 11
    assert m[f"{s.prefix}/failures/dead"] == 2 * 15 and m[f"{s.prefix}/scored"] == 2 * 5
    make.plan = ["raise"]  # the backend dies and cannot be started: the back-off starts over
    s.drop(kill=True)
    assert s.score(ITEMS[:1]) == ["dead"] and s.score(ITEMS[:1]) == ["dead"]
    calls = make.calls
    assert s.score(ITEMS[:1]) == ["dead"] and make.calls == calls + 1  # one skipped, as at first


def test_a_backend_that_dies_in_a_call_is_started_again_at_once() -> None:
    """Back-off is for start-ups: a running backend that fails is replaced on the next batch."""

    class Dying(Engine):
        def generate(self, reqs: list[Any]) -> list[list[Completion]]:
            raise BrokenPipeError("the judge process died")

    made: list[Engine] = [Dying(), Engine("9")]
    tok = load_tokenizer(str(ROOT / "models" / "tiny-base"))
    j = Judge(JudgeConfig(model="m", domains=["*"]), 0, lambda: made.pop(0), tokenizer=tok)
    assert j.score(ITEMS[:1]) == ["dead"]
    assert j.score(ITEMS[:1]) == [pytest.approx(0.9)]
    assert j.metrics()["judge/start_failures"] == 0 and j.metrics()["judge/start_skipped"] == 0
