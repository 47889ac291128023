"""Issue 39, in-process parts: failure counts and the quarantine, the scheduler leaving a
quarantined domain out, the start-up fit check, and the prompt-set cache.

The parts that need processes (a worker killed at its deadline, the hostile plugin, the whole
registry in one run) are in tests/integration/test_domain_faults.py.
"""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from megatron_rl.config import load_config
from megatron_rl.controller.admission import admit, fit_calls, prompt_limit, token_length
from megatron_rl.domains import Domain, Task, VerifyResult, load_domains
from megatron_rl.domains.health import DomainHealth
from megatron_rl.domains.workers import Call, DomainWorkers, Outcome
from megatron_rl.evaluation.prompt_cache import PromptCache
from megatron_rl.evaluation.prompt_sets import draw_distinct
from megatron_rl.model.tokenizer import load_tokenizer
from megatron_rl.scheduler import DomainInfo, DomainScheduler, SchedulerConfig
from megatron_rl.scheduler.policies import allocate
from megatron_rl.train.preflight import check_model

DEMO = "configs/demo_cpu.yaml"


def test_quarantine_needs_both_the_count_and_the_rate() -> None:
    h = DomainHealth(max_failure_rate=0.5, min_failures=3)
    for _ in range(2):
        h.fail("a", "verify_timeout", "slow")
    assert not h.is_quarantined("a")  # two failures: under min_failures
    for _ in range(10):
        h.ok("b")
    for _ in range(3):
        h.fail("b", "generate_error", "boom")
    assert not h.is_quarantined("b")  # 3 of 13 calls: under the rate
    h.fail("a", "verify_timeout", "slow")
    assert h.is_quarantined("a")  # 3 of 3
    events = h.take_events()
    assert [e["domain"] for e in events] == ["a"] and "verify_timeout" in events[0]["reason"]
    h.fail("a", "verify_timeout", "slow")
    assert h.take_events() == []  # one event per domain
    m = h.metrics()
    assert m["health/a/verify_timeout"] == 4 and m["health/b/generate_error"] == 3
    assert m["health/quarantined"] == 1 and m["health/failures"] == 7
    with pytest.raises(ValueError, match="failure kind must be one of"):
        h.fail("a", "oops")


def test_health_state_round_trip_and_skipped_calls_count_nowhere() -> None:
    h = DomainHealth(min_failures=1)
    assert not h.record("a", "verify", Outcome(failure="skipped"))
    assert h.metrics()["health/failures"] == 0
    assert not h.record("a", "verify", Outcome(failure="died", message="exit -9"))
    assert h.metrics()["health/a/verify_error"] == 1 and h.is_quarantined("a")
    again = DomainHealth(min_failures=1)
    again.load_state_dict(h.state_dict())
    assert again.summary() == h.summary()


def _sched(n: int = 4) -> DomainScheduler:
    infos = [DomainInfo(f"d{i}", "long_tail", [0], []) for i in range(n)]
    return DomainScheduler(SchedulerConfig(), infos, seed=0)


def test_scheduler_never_plans_an_excluded_domain() -> None:
    s = _sched()
    s.exclude("d2")
    for step in range(20):
        assert all(g.domain != "d2" for g in s.plan(step, 16))
    assert s.mix()[2] == 0 and abs(s.mix().sum() - 1) < 1e-12
    other = _sched()
    other.load_state_dict(s.state_dict())
    assert other.excluded.tolist() == [False, False, True, False]
    s.exclude("d0")
    s.exclude("d1")
    with pytest.raises(RuntimeError, match="every domain is quarantined"):
        s.exclude("d3")


def test_allocate_with_every_weight_positive_is_unchanged() -> None:
    w = np.array([0.1, 0.4, 0.2, 0.3])
    for seed in range(5):
        a = allocate(w, 13, np.random.default_rng(seed))
        r = np.random.default_rng(seed)  # the formula before zero weights were skipped
        edges = np.cumsum(w) / w.sum()
        edges[-1] = 1.0
        picks = np.searchsorted(edges, (r.random() + np.arange(13)) / 13, side="right")
        assert a.tolist() == np.bincount(np.minimum(picks, 3), minlength=4).tolist()
    z = np.array([0.5, 0.0, 0.5, 0.0])
    assert all(allocate(z, 7, np.random.default_rng(s))[[1, 3]].sum() == 0 for s in range(50))


class _Raises(Domain):
    name = "test/raises"

    def generate(self, level: int, rng: random.Random) -> tuple[str, str, dict[str, Any]]:
        raise RuntimeError("no")


def test_inline_workers_turn_exceptions_into_outcomes() -> None:
    w = DomainWorkers(0)
    w._inline = {"test/raises": _Raises()}  # the inline registry, with a domain of this test
    out = w.run(
        [Call("task", "test/raises", ("train", 0, 0, 0), 1.0), Call("task", "nope", (), 1.0)],
        skip=lambda c: False,
    )
    assert [o.failure for o in out] == ["error", "error"]
    assert "generator failed" in out[0].message and "unknown domain" in out[1].message


def _fit_cfg(include: list[str], *extra: str) -> Any:
    return load_config(DEMO, [f"domains.include={include}", "domains.workers=0", *extra])


def test_fit_check_leaves_out_what_does_not_fit_and_strict_refuses() -> None:
    names = ["tinywide/chain_sum", "tinywide/spell_backward_long"]
    cfg = _fit_cfg(names)
    model = check_model(cfg)
    tok = load_tokenizer(model.hf_path)
    doms = load_domains(names)
    prompts = {  # the draws the check makes (fit_calls: alternating splits, far indices)
        n: [d.task(*c.args).prompt for c in fit_calls(d, 0, 8, cfg.seed, 1.0)]
        for n, d in doms.items()
    }
    longest = {n: max(token_length(tok, p, 10**6) for p in ps) for n, ps in prompts.items()}
    short, long_ = sorted(longest, key=longest.get)  # type: ignore[arg-type]
    assert longest[short] < longest[long_], longest
    # a context that holds the shorter domain's prompts but not the longer one's
    positions = longest[short] + cfg.rollout.max_new_tokens
    small = replace(model, max_position_embeddings=positions)
    assert prompt_limit(small, cfg.rollout.max_new_tokens) == longest[short]
    fit = admit(cfg, small, tok)
    assert list(fit.domains) == [short]
    (left,) = fit.left_out
    assert left.domain == long_ and left.reason == "too_long"
    seen = int(left.detail.split("longest sample seen ")[1].split()[0])
    assert longest[short] < seen <= longest[long_] and f"limit {longest[short]}" in left.line()
    assert fit.summary()["left_out"][0]["domain"] == long_
    strict = _fit_cfg(names, "domains.strict=true")
    with pytest.raises(ValueError, match=f"(?s)domains.strict: 1 selected.*{long_}"):
        admit(strict, small, tok)
    with pytest.raises(ValueError, match="no selected domain fits"):
        admit(cfg, replace(model, max_position_embeddings=cfg.rollout.max_new_tokens + 3), tok)


def test_prompt_cache_round_trip_and_key(tmp_path: Any) -> None:
    dom = load_domains(["tinywide/chain_sum"])["tinywide/chain_sum"]
    cache = PromptCache(str(tmp_path))
    value = draw_distinct(dom, "eval", 5, 0, 3)
    assert cache.get(dom, 0, "eval", 3, 5) is None
    cache.put(dom, 0, "eval", 3, 5, value)
    got = cache.get(dom, 0, "eval", 3, 5)
    assert got is not None and [t.to_dict() for t in got[0]] == [t.to_dict() for t in value[0]]
    assert got[1:] == value[1:]
    assert cache.get(dom, 0, "eval", 3, 6) is None and cache.get(dom, 0, "train", 3, 5) is None
    assert cache.get(dom, 0, "eval", 4, 5) is None
    odd = Task(dom.name, "eval", 0, "x", "p", "g", {"pair": (1, 2)})  # JSON would make a list
    cache.put(dom, 0, "eval", 9, 1, ([odd], 1, 1.0))
    assert cache.get(dom, 0, "eval", 9, 1) == ([odd], 1, 1.0)
    entries = list(tmp_path.rglob("*.json"))
    assert len(entries) == 2 and not list(tmp_path.rglob("*.pkl"))
    for f in entries:
        f.write_bytes(b"not json")
    assert cache.get(dom, 0, "eval", 3, 5) is None  # unreadable: a miss, not an error


def test_draw_distinct_stops_at_its_budget() -> None:
    dom = load_domains(["tinywide/chain_sum"])["tinywide/chain_sum"]
    tasks, draws, size = draw_distinct(dom, "eval", 50, 0, 0, budget_s=0.0)
    assert tasks == [] and draws == 0 and size != size  # nan: stopped, not explored


def test_the_quick_fit_test_agrees_with_tokenizing() -> None:
    from megatron_rl.controller.admission import prompt_fits

    tok = load_tokenizer(check_model(load_config(DEMO, [])).hf_path)
    doms = load_domains(["tinywide/*", "rg/ab@0", "tinymix/*"])
    prompts = [d.task("eval", i, None, 0).prompt for d in doms.values() for i in range(3)]
    prompts += ["é" * 40, "x" * 2000, "word " * 90]
    lengths = [token_length(tok, p, 10**6) for p in prompts]
    for limit in (30, 60, 120, 488, 600):
        fits = prompt_fits(tok, limit)
        assert [fits(p) for p in prompts] == [n <= limit for n in lengths], limit


class _Slow(Domain):
    name = "test/slow"
    calls = 0

    def generate(self, level: int, rng: random.Random) -> tuple[str, str, dict[str, Any]]:
        import time

        _Slow.calls += 1
        time.sleep(30.0 if _Slow.calls == 12 else 0.01)  # the 12th draw far too slow
        return f"{rng.random()}", "1", {}

    def score(self, task: Task, answer: str) -> tuple[float, dict[str, Any]]:
        return 1.0, {}


def test_a_draw_near_its_deadline_keeps_what_it_drew() -> None:
    from megatron_rl.domains.workers import call_domain

    t0 = __import__("time").monotonic()
    call = Call("draw", "test/slow", ("eval", 50, 0, 0, 100.0), 3.0)
    tasks, draws, size = call_domain({"test/slow": _Slow()}, call)
    took = __import__("time").monotonic() - t0
    assert 0 < len(tasks) < 50 and size != size and took < 3.0, (len(tasks), took)


def test_a_plugin_that_hangs_or_lies_is_recorded_not_loaded(monkeypatch: Any) -> None:
    import importlib
    import time

    reg_mod = importlib.import_module("megatron_rl.domains.registry")

    monkeypatch.setattr(reg_mod, "LOAD_TIMEOUT_S", 0.5)
    reg = reg_mod.Registry()
    t0 = time.monotonic()
    reg.load_plugin("sleepy", "x:y", lambda: time.sleep(60))
    assert time.monotonic() - t0 < 5
    bad = _Raises()
    bad.levels = ()  # type: ignore[assignment]
    reg.load_plugin("nolevels", "x:z", lambda: lambda: [bad])
    assert not reg.domains
    msgs = [str(e) for e in reg.errors]
    assert "did not load within 0.5 s" in msgs[0] and "levels must be" in msgs[1], msgs


def test_garbage_from_a_plugin_override_is_a_failure() -> None:
    from megatron_rl.domains.guard import DomainGuard

    cfg = load_config(DEMO, ["domains.workers=0"]).domains
    guard = DomainGuard(DomainWorkers(0), cfg)
    calls = [Call("verify", "a", (), 1.0), Call("verify", "b", (), 1.0), Call("task", "c", (), 1)]
    values = iter(["yes", VerifyResult(float("nan"), True), None])
    guard.workers.run = lambda cs, skip=None, done=None, chunk=8: [  # type: ignore[method-assign]
        _done(done, c, Outcome(value=next(values))) for c in cs
    ]
    outs = guard._run(calls[:2], "verify") + guard._run(calls[2:], "generate")
    assert [o.failure for o in outs] == ["error"] * 3
    assert "not a VerifyResult" in outs[0].message and "not a number" in outs[1].message
    assert guard.health.metrics()["health/c/generate_error"] == 1


def _done(done: Any, c: Call, o: Outcome) -> Outcome:
    done(c, o)
    return o
