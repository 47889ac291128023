"""The pre-screen (``scheduler.prescreen_groups``, megatron_rl/controller/prescreen.py): which
domains it keeps, what it draws and samples, and its refusals."""

from __future__ import annotations

import random
from typing import Any

import pytest

from megatron_rl.controller.prescreen import SCREEN_INDEX, prescreen
from megatron_rl.domains.base import Domain, Task
from megatron_rl.rollout.base import Completion, GenRequest
from megatron_rl.scheduler.config import SchedulerConfig

GROUP = 4


class Yes(Domain):
    """Scores 1 for the answer "yes": the fake engine decides per domain what it answers."""

    def __init__(self, name: str, multi_turn: bool = False) -> None:
        self.name, self.family, self.multi_turn = name, "t", multi_turn

    def generate(self, level: int, rng: random.Random) -> tuple[str, str, dict[str, Any]]:
        return f"say yes {rng.randint(0, 10**6)}", "yes", {}

    def score(self, task: Task, answer: str) -> tuple[float, dict[str, Any]]:
        return float(answer.strip() == "yes"), {}


class Engine:
    """Answers by domain: ``solved`` always yes, ``hopeless`` never, ``frontier`` yes in the
    second group only (so each group but one is flat, and the domain still has signal)."""

    def __init__(self) -> None:
        self.requests: list[GenRequest] = []

    def generate(self, requests: list[GenRequest]) -> list[list[Completion]]:
        self.requests += requests
        seen: dict[str, int] = {}
        out = []
        for r in requests:
            k = seen[r.tag] = seen.get(r.tag, -1) + 1
            texts = {
                "t/solved": ["yes"] * r.params.n,
                "t/hopeless": ["no"] * r.params.n,
                "t/frontier": ["no"] * r.params.n if k == 0 else ["yes", "no"] * (r.params.n // 2),
            }.get(r.tag, ["no"] * r.params.n)
            out.append([Completion([1], t, [0.0], "stop") for t in texts])
        return out


def domains(*names: str) -> dict[str, Domain]:
    return {n: Yes(n, multi_turn=n.endswith("tools")) for n in names}


def screen(doms: dict[str, Domain], engine: Engine | None = None, **kw: Any) -> Any:
    kw = {"groups": 2, "group_size": GROUP, "seed": 7, "max_tokens": 8, **kw}
    return prescreen(engine or Engine(), Tokenizer(), doms, **kw)


class Tokenizer:
    """Enough of a tokenizer for ``prompt_ids``: a chat template and ``encode``."""

    chat_template = "{{ messages }}"

    def apply_chat_template(self, messages: list[dict[str, str]], **_: Any) -> str:
        return messages[-1]["content"]

    def encode(self, text: str, **_: Any) -> list[int]:
        return [ord(c) % 256 for c in text]


def test_keeps_the_domains_with_signal_and_the_unscreened_ones() -> None:
    engine = Engine()
    doms = domains("t/solved", "t/hopeless", "t/frontier", "t/tools")
    s = screen(doms, engine, temperature=lambda n: 0.7 if n == "t/frontier" else 1.0)
    assert s.signal == ["t/frontier"] and s.flat == ["t/hopeless", "t/solved"]
    assert s.unscreened == ["t/tools"]  # multi-turn: never generated here, kept
    assert s.kept == ["t/frontier", "t/tools"] and s.groups == 6
    assert all(r.params.seed == 7 and r.params.n == GROUP for r in engine.requests)
    temps = {r.tag: r.params.temperature for r in engine.requests}
    assert temps == {"t/solved": 1.0, "t/hopeless": 1.0, "t/frontier": 0.7}
    assert s.to_json()["kept"] == s.kept


def test_draws_training_prompts_apart_from_the_run_cursor_at_the_first_level() -> None:
    wanted: list[tuple[str, int, int]] = []
    doms = domains("t/solved", "t/frontier")

    def draw(w: Any, seed: int) -> list[Task | None]:
        wanted.extend(w)
        return [doms[d].task("train", i, lv, seed) if d != "t/solved" else None for d, i, lv in w]

    s = screen(doms, draw=draw)
    assert {i for _, i, _ in wanted} == {SCREEN_INDEX, SCREEN_INDEX + 1}
    assert s.unscreened == ["t/solved"]  # its prompts could not be drawn: kept, not judged
    assert s.groups == 2 and s.kept == ["t/frontier", "t/solved"]


def test_a_prompt_that_does_not_fit_is_not_generated_and_its_domain_stays() -> None:
    engine = Engine()
    s = screen(domains("t/hopeless", "t/frontier"), engine, fits=lambda t: t.domain != "t/hopeless")
    assert {r.tag for r in engine.requests} == {"t/frontier"}
    assert s.unscreened == ["t/hopeless"] and s.kept == ["t/frontier", "t/hopeless"]


def test_a_failed_verification_scores_zero() -> None:
    doms = domains("t/solved", "t/hopeless")
    calls = iter(range(10**6))

    def verify(pairs: Any) -> list[Any]:  # every other verdict of the solved domain fails
        return [doms[t.domain].verify(t, r) if next(calls) % 2 else None for t, r in pairs]

    assert screen(doms, verify=verify).signal == ["t/solved"]


def test_no_signal_anywhere_keeps_every_domain() -> None:
    s = screen(domains("t/solved", "t/hopeless"))
    assert s.signal == [] and s.kept == ["t/hopeless", "t/solved"]


@pytest.mark.parametrize(("groups", "size"), [(0, 4), (2, 1)])
def test_refuses_a_screen_that_cannot_see_variance(groups: int, size: int) -> None:
    with pytest.raises(ValueError, match="prescreen needs groups >= 1"):
        screen(domains("t/solved"), groups=groups, group_size=size)


def test_config_refuses_a_negative_count() -> None:
    with pytest.raises(ValueError, match="scheduler.prescreen_groups must be >= 0"):
        SchedulerConfig(prescreen_groups=-1).validate()


def test_uniform_over_the_kept_domains_plans_as_the_study_arm_static_mix() -> None:
    """The in-run screen excludes; the study's arm gave static even weights: the same plans."""
    from benchmarks.studies.scheduler_runs import even
    from megatron_rl.scheduler import DomainInfo, DomainScheduler

    names = [f"d/{i:02d}" for i in range(40)]
    kept = names[3:40:4]
    infos = [DomainInfo(n, "long_tail", [0], []) for n in names]
    excluding = DomainScheduler(SchedulerConfig(), infos, 3)
    for n in set(names) - set(kept):
        excluding.exclude(n)
    static = DomainScheduler(SchedulerConfig(policy="static", weights=even(kept)), infos, 3)
    for step in range(20):
        plan = [g.domain for g in excluding.plan(step, 32)]
        assert plan == [g.domain for g in static.plan(step, 32)]
        assert set(plan) <= set(kept) and len(set(plan)) == len(kept)
