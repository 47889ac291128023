"""The generative judge (megatron_rl/rewards/judge.py): verdicts parsed into [0, 1], and every
way a verdict can be missing counted per sample, dropping its group, never a silent 0 and never
the end of the run: unparsable and empty verdicts, timeouts, a dead judge."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from megatron_rl.config import load_config
from megatron_rl.controller.generate import add_verdicts
from megatron_rl.domains.base import Task
from megatron_rl.model.tokenizer import load_tokenizer
from megatron_rl.rewards.judge import Judge, JudgeConfig, parse_verdict
from megatron_rl.rollout.base import Completion
from megatron_rl.rollout.groups import Group, Sample
from megatron_rl.scheduler import GroupSpec

ROOT = Path(__file__).resolve().parents[2]
TASK = Task("d/x", "train", 0, "id", "What is 2 + 2?", "4")


class Fake:
    """An engine answering every request with ``reply`` (after ``delay`` s; ``fail`` raises)."""

    def __init__(self, reply: str = "8", delay: float = 0.0, fail: bool = False) -> None:
        self.reply, self.delay, self.fail, self.killed = reply, delay, fail, False

    def generate(self, reqs: list[Any]) -> list[list[Completion]]:
        time.sleep(self.delay)
        if self.fail:
            raise ConnectionError("judge server refused the connection")
        return [[Completion([5], self.reply, [0.0], "stop")] for _ in reqs]

    def kill(self) -> None:
        self.killed = True

    def shutdown(self) -> None:
        pass


def judge(engines: list[Any], **cfg: Any) -> Judge:
    made = iter(engines)

    def make() -> Any:
        e = next(made)
        if isinstance(e, Exception):
            raise e
        return e

    tok = load_tokenizer(str(ROOT / "models" / "tiny-base"))
    return Judge(JudgeConfig(model="m", domains=["d/*"], **cfg), 0, make, tokenizer=tok)


def test_verdicts_parse_into_unit_scores_or_a_failure_kind() -> None:
    cfg = JudgeConfig()
    assert parse_verdict(" 7 out of 10", cfg) == pytest.approx(0.7)
    assert parse_verdict("", cfg) == "empty" and parse_verdict("great!", cfg) == "unparsable"
    assert parse_verdict("11", cfg) == "unparsable"  # outside the scale is not a score
    choice = JudgeConfig(parse="choice", choices={"correct": 1.0, "wrong": 0.0})
    assert parse_verdict("Wrong, because", choice) == 0.0
    assert parse_verdict("maybe", choice) == "unparsable"


@pytest.mark.parametrize(
    ("engine", "kind"),
    [
        (Fake("no idea"), "unparsable"),
        (Fake("   "), "empty"),
        (Fake(fail=True), "dead"),
        (RuntimeError("cannot start the judge"), "dead"),
    ],
)
def test_each_failure_is_counted_per_sample_and_the_run_goes_on(engine, kind) -> None:
    j = judge([engine, Fake("9")])
    assert j.score([(TASK, "4"), (TASK, "5")]) == [kind, kind]
    assert j.failures[kind] == 2 and j.scored == 0
    no_start = isinstance(engine, Exception)
    if no_start:  # a judge that could not start is not tried again on the next batch
        assert j.score([(TASK, "4")]) == ["dead"] and j.metrics()["judge/start_skipped"] == 1
    # a judge that answered badly keeps answering; a dead one is replaced by a fresh engine
    want = [pytest.approx(0.9)] if kind == "dead" else [kind]
    assert j.score([(TASK, "4")]) == want
    m = j.metrics()
    assert m[f"judge/failures/{kind}"] == (2 + no_start if kind == "dead" else 3)
    assert m["judge/scored"] == (1 if kind == "dead" else 0)
    assert m["judge/start_failures"] == no_start


def test_a_judge_past_its_deadline_is_killed_and_replaced() -> None:
    slow = Fake("8", delay=2.0)
    j = judge([slow, Fake("6")], timeout_s=0.3)
    t0 = time.time()
    assert j.score([(TASK, "4")] * 3) == ["timeout"] * 3
    assert time.time() - t0 < 1.5 and slow.killed and j.failures["timeout"] == 3
    assert j.score([(TASK, "4")]) == [pytest.approx(0.6)]


def test_a_failed_verdict_drops_its_group_and_a_good_one_adds_its_weighted_score() -> None:
    def group(text: str) -> Group:
        g = Group(GroupSpec("d/x", 0, 1.0), TASK)
        g.samples = [Sample("d/x", [1], [2], [0.0], [1.0], text, "stop", 1.0) for _ in "ab"]
        return g

    j = judge([Fake("5")], weight=0.5)
    good = group("4")
    add_verdicts(j, [good])
    assert [s.reward for s in good.samples] == [1.25, 1.25] and not good.failed
    swap = judge([Fake("5")], weight=0.5, replace=True)
    replaced = group("4")
    for s in replaced.samples:
        s.verifier_reward = 1.0  # what the verifier's terms gave
    add_verdicts(swap, [replaced])
    assert [s.reward for s in replaced.samples] == [0.25, 0.25]  # the verdict alone
    bad = judge([Fake("???")])
    g = group("4")
    add_verdicts(bad, [g])
    assert g.failed == "judge" and bad.failures["unparsable"] == 2


def test_bad_judge_config_is_refused_naming_the_key() -> None:
    with pytest.raises(ValueError, match="rewards.judge.domains selects none"):
        load_config(None, ["rewards.judge.model=models/tiny-base"])
    with pytest.raises(ValueError, match="needs rewards.judge.choices"):
        load_config(None, ["rewards.judge.parse=choice"])
    with pytest.raises(ValueError, match=r"engine=sglang needs rewards.judge.urls"):
        load_config(None, ["rewards.judge.engine=sglang"])
    for url in ("ftp://judge:80", "judge:30000", "http://", "http://judge:port"):
        with pytest.raises(ValueError, match=r"rewards.judge.urls\[1\]=.*not an http\(s\) URL"):
            load_config(
                None, ["rewards.judge.engine=sglang", f"rewards.judge.urls=[http://a:1,{url}]"]
            )
    with pytest.raises(ValueError, match=r"urls\[0\]=''"):
        JudgeConfig(model="m", domains=["*"], engine="sglang", urls=[""]).validate()
    with pytest.raises(ValueError, match="rewards.judge.urls is set but"):
        load_config(None, ["rewards.judge.urls=[http://a:1]"])
    with pytest.raises(ValueError, match="rewards.judge.start_timeout_s"):
        load_config(None, ["rewards.judge.start_timeout_s=-1"])
    ok = load_config(
        None, ["rewards.judge.engine=sglang", "rewards.judge.urls=[https://judge.example:443]"]
    )
    assert ok.rewards.judge.urls == ["https://judge.example:443"]
