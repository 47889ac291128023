"""Unit tests of the domain scheduler: mix/floors, temperatures, curriculum, refill, seesaw,
exact resume and config errors. Pure numpy, no model: results are built by hand."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from megatron_rl.config import load_config
from megatron_rl.scheduler import DomainInfo, DomainScheduler, GroupResult, SchedulerConfig
from megatron_rl.scheduler.policies import allocate, mix_weights


def domains(n: int, levels: int = 1) -> list[DomainInfo]:
    return [DomainInfo(f"g{i % 3}/d{i}", "core", list(range(levels))) for i in range(n)]


def result(name: str, rewards: list[float], level: int = 0, entropy: float | None = None):
    k = len(rewards)
    return GroupResult(name, level, rewards, [10] * k, [False] * k, entropy)


def feed(sched: DomainScheduler, rate: dict[str, float], step: int, groups: int = 4) -> None:
    """Observe ``groups`` groups of 8 per domain at the given pass rate (deterministic)."""
    res = []
    for name, p in rate.items():
        passes = round(8 * p)
        res += [
            result(
                name, [1.0] * passes + [0.0] * (8 - passes), sched.curriculum.level(sched.pos[name])
            )
            for _ in range(groups)
        ]
    sched.observe(step, res)


def test_allocate_counts_are_floor_or_ceil_of_share():
    rng = np.random.default_rng(0)
    w = mix_weights(rng.random(50), floor=0.005)
    total = np.zeros(50)
    for _ in range(400):
        counts = allocate(w, 64, rng)
        assert counts.sum() == 64
        assert np.all(counts >= np.floor(w * 64)) and np.all(counts <= np.ceil(w * 64))
        total += counts
    np.testing.assert_allclose(total / (400 * 64), w, atol=0.004)


def test_floor_respected_even_for_starved_domains():
    cfg = SchedulerConfig(policy="target_difficulty", floor=0.02)
    sched = DomainScheduler(cfg, domains(10), seed=0)
    # d0..d8 saturated (no signal), d9 in the informative band
    feed(sched, {f"g{i % 3}/d{i}": (1.0 if i < 9 else 0.5) for i in range(10)}, step=0, groups=20)
    w = sched.mix()
    assert w.sum() == pytest.approx(1.0)
    assert w.min() >= 0.02 - 1e-12
    assert w[9] > 4 * w[:9].max()  # the informative domain gets the largest share
    counts = np.zeros(10)
    for step in range(1, 201):
        for spec in sched.plan(step, 50):
            counts[sched.pos[spec.domain]] += 1
    assert counts.min() >= 0.02 * 50 * 200  # every domain got at least its floor share


def test_static_weights_globs_and_tiers():
    doms = domains(6)
    cfg = SchedulerConfig(policy="static", weights={"g0/*": 0.6, "*": 0.4})
    w = DomainScheduler(cfg, doms, seed=0).mix()
    np.testing.assert_allclose(w, [0.3, 0.1, 0.1, 0.3, 0.1, 0.1])
    tiered = [DomainInfo(d.name, "core" if i < 2 else "long_tail") for i, d in enumerate(doms)]
    cfg = SchedulerConfig(policy="static", tier_weights={"core": 0.8, "long_tail": 0.2}, floor=0.01)
    w = DomainScheduler(cfg, tiered, seed=0).mix()
    np.testing.assert_allclose(w, 0.01 + 0.94 * np.array([0.4, 0.4, 0.05, 0.05, 0.05, 0.05]))


def test_learning_progress_prefers_moving_domain():
    cfg = SchedulerConfig(policy="learning_progress", lp_explore=0.0)
    sched = DomainScheduler(cfg, domains(2), seed=0)
    for step in range(30):  # d0 flat at 0.5, d1 climbing from 0 to 1
        feed(sched, {"g0/d0": 0.5, "g1/d1": min(step / 25, 1.0)}, step, groups=2)
    w = sched.mix()
    assert w[1] > 0.8


def test_temperature_schedule_and_bounds():
    cfg = SchedulerConfig(temperature=1.2, temperature_end=0.6, temperature_anneal_groups=10)
    sched = DomainScheduler(cfg, domains(2), seed=0)
    assert sched.temperatures() == pytest.approx([1.2, 1.2])
    feed(sched, {"g0/d0": 0.5}, step=0, groups=5)  # d0 half-way through its anneal
    assert sched.temperatures() == pytest.approx([0.9, 1.2])
    feed(sched, {"g0/d0": 0.5}, step=1, groups=20)
    assert sched.temperatures() == pytest.approx([0.6, 1.2])
    assert {s.temperature for s in sched.plan(2, 8) if s.domain == "g0/d0"} <= {0.6}


def test_temperature_controller_heats_refills_only_and_never_cools():
    cfg = SchedulerConfig(
        temperature_adapt="entropy",
        temperature_target=1.0,
        temperature_adapt_rate=0.2,
        temperature_min=0.5,
        temperature_max=1.4,
        filter_zero_variance=True,
        oversample=2.0,
    )
    sched = DomainScheduler(cfg, domains(2), seed=0)
    for step in range(60):  # d0's entropy far below target, d1's far above
        sched.observe(
            step, [result("g0/d0", [0, 1], entropy=0.1), result("g1/d1", [0, 1], entropy=5.0)]
        )
        t = sched.temperatures()
        assert np.all((t >= 1.0) & (t <= 1.4))  # never below the base (1.0)
    assert sched.temperatures() == pytest.approx([1.4, 1.0])  # d1 is not cooled
    specs = sched.plan(60, 8)
    primary, refill = specs[:8], specs[8:]
    assert {(s.temperature, s.heated) for s in primary} == {(1.0, False)}  # the mix: at base
    assert {(s.domain, s.temperature, s.heated) for s in refill} == {
        ("g0/d0", 1.4, True),
        ("g1/d1", 1.0, False),
    }


def test_mix_signals_are_measured_at_the_base_temperature_only():
    """Heated groups feed the controller (their own diversity), never the learnability or the
    level pass rate the mix and curriculum steer by."""
    sched = DomainScheduler(SchedulerConfig(policy="learnability", learn_ucb=0.0), domains(2), 0)
    flat, mixed = [1.0] * 8, [1.0, 0.0] * 4
    hot = GroupResult("g0/d0", 0, mixed, [10] * 8, [False] * 8, heated=True)
    sched.observe(0, [result("g0/d0", flat)] * 4 + [hot] * 4 + [result("g1/d1", mixed)] * 4)
    learn = sched.stats.learnability()
    assert learn == pytest.approx([0.0, 0.5])  # |r - mean| = 0.5 for half-pass groups
    rate, _ = sched.stats.level_pass_rate()
    assert rate[0] > 0.9  # 32 base samples all passed; the heated half-passes are not counted
    assert sched.stats.diversity(np.array([True, False])) == pytest.approx([1.0, 1.0])
    assert sched.stats.diversity(np.array([False, False]))[0] == pytest.approx(0.5, abs=0.05)
    w = sched.mix()
    assert w[1] > 0.99  # only d1 carries signal at the base temperature


def test_learnability_policy_prefers_the_frontier_and_explores_with_ucb():
    cfg = SchedulerConfig(policy="learnability", learn_ucb=0.0)
    sched = DomainScheduler(cfg, domains(4), seed=0)
    # d0 saturated (7/8), d1 at the frontier (4/8), d2 impossible (0/8); d3 never seen
    feed(sched, {"g0/d0": 7 / 8, "g1/d1": 0.5, "g2/d2": 0.0}, step=0, groups=10)
    w = sched.mix()
    p = 7 / 8
    assert w[:3] / w[1] == pytest.approx([2 * p * (1 - p) / 0.5, 1.0, 0.0], abs=1e-5)
    assert w[3] == pytest.approx(w[1])  # never measured: optimistic, the largest signal
    ucb = DomainScheduler(replace(cfg, learn_ucb=0.5), domains(4), seed=0)
    feed(ucb, {"g0/d0": 7 / 8, "g1/d1": 0.5, "g2/d2": 0.0, "g0/d3": 0.0}, step=0, groups=10)
    feed(ucb, {"g0/d0": 7 / 8, "g1/d1": 0.5, "g0/d3": 0.0}, step=1, groups=200)
    w = ucb.mix()
    assert w[2] > 2 * w[3] > 0  # same signal (none), d2 sampled 20x less: a larger UCB bonus


def test_learnability_room_and_power_concentrate_on_the_domain_with_room_left():
    """learn_room weighs the signal by 1 - p, learn_power sharpens: of two domains with the
    same 2p(1-p), the one at p = 1/4 beats the one at p = 3/4 by (3/4 / 1/4)^power."""
    cfg = SchedulerConfig(policy="learnability", learn_ucb=0.0, prior_strength=1e-3)
    rates = {"g0/d0": 0.25, "g1/d1": 0.75, "g2/d2": 0.5}
    plain = DomainScheduler(cfg, domains(3), seed=0)
    feed(plain, rates, step=0, groups=50)
    w = plain.mix()
    assert w[0] == pytest.approx(w[1], rel=1e-3) and w[2] > w[0]  # 0.375, 0.375, 0.5
    for power in (1.0, 2.0):
        sched = DomainScheduler(replace(cfg, learn_room=True, learn_power=power), domains(3), 0)
        feed(sched, rates, step=0, groups=50)
        w = sched.mix()
        assert w[0] / w[1] == pytest.approx(3.0**power, rel=1e-2)
        expect = np.array([0.375 * 0.75, 0.375 * 0.25, 0.5 * 0.5]) ** power
        assert w == pytest.approx(expect / expect.sum(), rel=1e-2)


def test_learnability_metric_and_groups_measured_count():
    sched = DomainScheduler(SchedulerConfig(policy="learnability"), domains(2), seed=0)
    feed(sched, {"g0/d0": 0.25}, step=0, groups=3)
    m = sched.metrics()
    assert m["sched/g0/d0/learnability"] == pytest.approx(2 * 0.25 * 0.75)
    assert "sched/g1/d1/learnability" not in m  # never measured
    assert sched.stats.measured_seen.tolist() == [3, 0]
    assert m["sched/g0/d0/base_temperature"] == 1.0


def test_curriculum_promotes_then_demotes():
    cfg = SchedulerConfig(curriculum=True, curriculum_min_samples=32)
    sched = DomainScheduler(cfg, domains(2, levels=3), seed=0)
    feed(sched, {"g0/d0": 1.0, "g1/d1": 0.5}, step=0, groups=2)  # 16 samples: too few
    assert sched.curriculum.current_levels().tolist() == [0, 0]
    feed(sched, {"g0/d0": 1.0, "g1/d1": 0.5}, step=1, groups=4)
    assert sched.curriculum.current_levels().tolist() == [1, 0]
    assert sched.events[-1]["event"] == "promote" and sched.events[-1]["domain"] == "g0/d0"
    assert {s.level for s in sched.plan(2, 16) if s.domain == "g0/d0"} == {1}
    feed(sched, {"g0/d0": 0.0}, step=3, groups=6)  # collapses at level 1
    assert sched.curriculum.current_levels().tolist() == [0, 0]
    assert sched.events[-1]["event"] == "demote"


def test_curriculum_start_level():
    """Long-context runs start every domain at a given length level (issue 17)."""
    cfg = SchedulerConfig(curriculum=True, curriculum_start_level=1, curriculum_min_samples=8)
    sched = DomainScheduler(cfg, domains(2, levels=3), seed=0)
    assert sched.curriculum.current_levels().tolist() == [1, 1]
    assert {s.level for s in sched.plan(0, 8)} == {1}
    far = DomainScheduler(SchedulerConfig(curriculum_start_level=9), domains(1, levels=3), seed=0)
    assert far.curriculum.current_levels().tolist() == [2]  # beyond the top: the top level
    with pytest.raises(ValueError, match="scheduler.curriculum_start_level=-1 must be >= 0"):
        SchedulerConfig(curriculum_start_level=-1).validate()


def test_curriculum_max_level_caps_promotion():
    """scheduler.curriculum_max_level: a domain that keeps passing stops at the cap (issue 27)."""
    cfg = SchedulerConfig(curriculum=True, curriculum_min_samples=8, curriculum_max_level=1)
    sched = DomainScheduler(cfg, domains(1, levels=4), seed=0)
    for step in range(6):
        feed(sched, {"g0/d0": 1.0}, step=step, groups=2)
    assert sched.curriculum.current_levels().tolist() == [1]
    assert [e["to_level"] for e in sched.events if e["event"] == "promote"] == [1]
    with pytest.raises(ValueError, match="curriculum_max_level=0 must be -1"):
        SchedulerConfig(curriculum_start_level=1, curriculum_max_level=0).validate()


def test_zero_variance_refill_keeps_batch_size_and_mix():
    cfg = SchedulerConfig(filter_zero_variance=True, oversample=2.0)
    sched = DomainScheduler(cfg, domains(2), seed=0)
    a, b = "g0/d0", "g1/d1"
    mixed, flat = [0.0, 1.0, 1.0, 0.0], [1.0] * 4
    primary = [result(a, flat), result(a, mixed), result(b, flat), result(b, mixed)]
    extra = [result(a, flat), result(b, mixed), result(a, mixed), result(b, mixed)]
    kept = sched.select(primary + extra, 4)
    assert kept == [1, 3, 5, 6]  # d0's dropped slot refilled by d0's extra (6), d1's by 5
    m = sched.metrics()  # drop rate: zero-variance groups filtered / groups generated
    assert m["sched/g0/d0/drop_rate"] == pytest.approx(2 / 4)
    assert m["sched/g1/d1/drop_rate"] == pytest.approx(1 / 4)
    # Not enough groups with signal: zero-variance ones fill up, the batch keeps its size.
    kept = sched.select([result(a, flat)] * 3 + [result(b, mixed)] + [result(a, flat)] * 4, 4)
    assert len(kept) == 4 and len(set(kept)) == 4 and 3 in kept


def test_events_fit_a_tracker_call_and_history_keeps_steps():
    cfg = SchedulerConfig(seesaw=True, seesaw_consecutive=1)
    sched = DomainScheduler(cfg, domains(1), seed=0)
    sched.observe_eval(0, {"g0/d0": [1.0] * 32})
    logged = []

    def tracker_event(step: int, kind: str, **fields: object) -> None:  # the loop's signature
        logged.append((step, kind, fields["domain"]))

    for e in sched.observe_eval(5, {"g0/d0": [0.0] * 32}):
        tracker_event(5, e.pop("event"), **e)
    assert logged == [(5, "regression", "g0/d0")]
    assert sched.events == [
        {
            "step": 5,
            "event": "regression",
            "domain": "g0/d0",
            "score": 0.0,
            "best": 1.0,
            "drop": 1.0,
            "shared_dip": 0,
            "diff_upper_bound": -1.0,
        }
    ]


def test_no_filter_keeps_the_primary_groups():
    sched = DomainScheduler(SchedulerConfig(oversample=1.5), domains(2), seed=0)
    assert len(sched.plan(0, 8)) == 8  # no refill groups without the filter
    flat = [result("g0/d0", [1.0, 1.0])] * 12
    assert sched.select(flat, 8) == list(range(8))
    filtering = DomainScheduler(replace(sched.cfg, filter_zero_variance=True), domains(2), 0)
    assert len(filtering.plan(0, 8)) == 12


def sweep(base: np.ndarray, shift: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Per-prompt scores [D, P]: ``base`` moved by ``shift`` [D], plus small noise."""
    return np.clip(base + shift[:, None] + rng.normal(0, 0.02, base.shape), 0, 1)


def test_seesaw_flags_a_sustained_drop_after_consecutive_sweeps_and_boosts_it():
    cfg = SchedulerConfig(seesaw=True, seesaw_boost=4.0)
    sched = DomainScheduler(cfg, domains(3), seed=0)
    rng = np.random.default_rng(1)
    base = rng.uniform(0.2, 0.8, (3, 64))
    names = sched.names

    def observe(step: int, shift: list[float]) -> list[tuple[str, str]]:
        x = sweep(base, np.array(shift), rng)
        events = sched.observe_eval(step, {n: x[i].tolist() for i, n in enumerate(names)})
        return [(e["event"], e["domain"]) for e in events]

    for step in range(3):
        assert observe(step, [0.0, 0.0, 0.0]) == []
    assert observe(3, [-0.15, -0.015, 0.0]) == []  # one drop sweep is not enough
    assert observe(4, [-0.15, -0.015, 0.0]) == [("regression", names[0])]  # d1: under min_drop
    assert sched.mix() == pytest.approx([4 / 6, 1 / 6, 1 / 6])
    assert observe(5, [0.0, 0.0, 0.0]) == [("recovery", names[0])]
    assert sched.mix() == pytest.approx([1 / 3] * 3)


def test_seesaw_reference_is_a_robust_best_not_one_lucky_sweep():
    cfg = SchedulerConfig(seesaw=True, seesaw_consecutive=1, seesaw_window=3)
    sched = DomainScheduler(cfg, domains(1), seed=0)
    rng = np.random.default_rng(2)
    base = rng.uniform(0.3, 0.7, (1, 64))
    for step, shift in enumerate([0.0, 0.0, 0.12, 0.0]):  # sweep 2 is a lucky outlier
        sched.observe_eval(step, {"g0/d0": sweep(base, np.array([shift]), rng)[0].tolist()})
    # the per-prompt median of 3 sweeps: near the true level, far below the outlier (+0.12)
    assert base.mean() <= sched.guard.best_mean[0] < base.mean() + 0.02
    assert sched.events == []  # the sweep after the outlier is no "regression" from it
    plain = SchedulerConfig(seesaw=True, seesaw_consecutive=1, seesaw_window=1)
    naive = DomainScheduler(plain, domains(1), seed=0)  # window 1 = best single sweep
    rng = np.random.default_rng(2)
    rng.uniform(0.3, 0.7, (1, 64))
    for step, shift in enumerate([0.0, 0.0, 0.12, 0.0]):
        naive.observe_eval(step, {"g0/d0": sweep(base, np.array([shift]), rng)[0].tolist()})
    assert [e["event"] for e in naive.events] == ["regression"]


def test_seesaw_discounts_a_dip_every_domain_shares():
    cfg = SchedulerConfig(seesaw=True, seesaw_consecutive=1)
    sched = DomainScheduler(cfg, domains(4), seed=0)
    rng = np.random.default_rng(3)
    base = rng.uniform(0.3, 0.7, (4, 64))
    names = sched.names
    for step, shift in enumerate([[0.0] * 4, [-0.1] * 4, [-0.1, -0.1, -0.1, -0.25]]):
        x = sweep(base, np.array(shift), rng)
        sched.observe_eval(step, {n: x[i].tolist() for i, n in enumerate(names)})
    # sweep 1: all dip by 0.1 -> nothing; sweep 2: d3 dips 0.15 more than the others
    assert [(e["step"], e["domain"]) for e in sched.events] == [(2, names[3])]
    assert sched.events[0]["shared_dip"] == pytest.approx(0.1, abs=0.02)
    blind = DomainScheduler(replace(cfg, seesaw_common=False), domains(4), seed=0)
    rng = np.random.default_rng(3)
    rng.uniform(0.3, 0.7, (4, 64))
    x = sweep(base, np.zeros(4), rng)
    blind.observe_eval(0, {n: x[i].tolist() for i, n in enumerate(names)})
    x = sweep(base, np.full(4, -0.1), rng)
    assert len(blind.observe_eval(1, {n: x[i].tolist() for i, n in enumerate(names)})) == 4


def test_seesaw_bootstraps_over_distinct_prompts():
    """Four distinct prompts repeated 16 times: with their ids the drop is not significant
    (4 prompts), without them the 64 copies look like 64 independent prompts."""
    cfg = SchedulerConfig(seesaw=True, seesaw_consecutive=1)
    before = [0.5, 0.5, 0.5, 0.5] * 16
    after = [0.0, 0.0, 0.5, 0.6] * 16
    ids = {"g0/d0": ["p0", "p1", "p2", "p3"] * 16}
    for with_ids, flagged in ((True, False), (False, True)):
        sched = DomainScheduler(cfg, domains(1), seed=0)
        sched.observe_eval(0, {"g0/d0": before}, ids if with_ids else None)
        sched.observe_eval(1, {"g0/d0": after}, ids if with_ids else None)
        assert bool(sched.guard.flagged[0]) is flagged
    with pytest.raises(ValueError, match="3 prompt ids for 64 eval scores"):
        sched.observe_eval(2, {"g0/d0": after}, {"g0/d0": ["a", "b", "c"]})


def test_lag_boost_favours_domains_below_the_median_eval():
    sched = DomainScheduler(SchedulerConfig(lag_boost=2.0), domains(3), seed=0)
    assert sched.mix() == pytest.approx([1 / 3] * 3)  # no eval yet: no boost
    sched.observe_eval(0, {"g0/d0": [0.2], "g1/d1": [0.6], "g2/d2": [0.9]})
    boost = np.exp(2.0 * 0.4)
    assert sched.mix() == pytest.approx(np.array([boost, 1, 1]) / (boost + 2))


def test_seesaw_needs_significance_on_small_noisy_sets():
    sched = DomainScheduler(SchedulerConfig(seesaw=True), domains(1), seed=0)
    sched.observe_eval(0, {"g0/d0": [1.0, 0.0, 1.0, 0.0, 1.0, 0.0]})
    # mean drops by 1/6 but per-task differences are +-1: not significant
    events = sched.observe_eval(1, {"g0/d0": [0.0, 1.0, 0.0, 0.0, 1.0, 0.0]})
    assert events == [] and not sched.guard.flagged[0]


def test_exact_resume_same_plans_after_reload():
    cfg = SchedulerConfig(
        policy="target_difficulty",
        floor=0.01,
        curriculum=True,
        curriculum_min_samples=16,
        filter_zero_variance=True,
        oversample=1.5,
        seesaw=True,
        temperature_adapt="diversity",
        temperature_target=0.7,
    )
    doms = domains(12, levels=3)

    def run(sched: DomainScheduler, steps: range, log: list) -> None:
        rng = np.random.default_rng(steps.start)  # the "environment", same in both runs
        for step in steps:
            specs = sched.plan(step, 16)
            log.append([(s.domain, s.level, s.temperature) for s in specs])
            res = [
                result(
                    s.domain,
                    (rng.random(4) < 0.6).astype(float).tolist(),
                    s.level,
                    float(rng.random()),
                )
                for s in specs
            ]
            sched.observe(step, res)
            log.append(sched.select(res, 16))
            if step % 5 == 0:
                sched.observe_eval(step, {n: rng.random(8).tolist() for n in sched.names})

    first = DomainScheduler(cfg, doms, seed=7)
    run(first, range(0, 20), [])
    saved = json.loads(json.dumps(first.state_dict()))  # state is plain, serialisable data
    expected: list = []
    run(first, range(20, 40), expected)
    resumed = DomainScheduler(cfg, doms, seed=999)
    resumed.load_state_dict(saved)
    got: list = []
    run(resumed, range(20, 40), got)
    assert got == expected
    assert resumed.metrics() == pytest.approx(first.metrics(), nan_ok=True)


def test_resume_rejects_other_domain_list():
    sd = DomainScheduler(SchedulerConfig(), domains(3), seed=0).state_dict()
    with pytest.raises(ValueError, match="different domain list"):
        DomainScheduler(SchedulerConfig(), domains(4), seed=0).load_state_dict(sd)


@pytest.mark.parametrize(
    "override, message",
    [
        (
            "scheduler.policy=bogus",
            r"not registered; choose one of \['learnability', 'learning_progress', 'static'",
        ),
        ("scheduler.weights={a: 0.5, b: 0.4}", "weights must sum to 1"),
        ("scheduler.tier_weights={core: 0.5, long_tail: 0.6}", "tier_weights must sum to 1"),
        ("scheduler.temperature=0", r"scheduler.temperature=0.0 must be > 0"),
        ("scheduler.temperature_min=-1", "temperature_min=-1.0 must be > 0"),
        ("scheduler.floor=1.5", r"floor=1.5 must be in \[0, 1\)"),
        ("scheduler.oversample=0.5", "oversample=0.5 must be >= 1"),
        ("scheduler.lag_boost=-1", "lag_boost=-1.0 must be >= 0"),
        ("scheduler.seesaw_window=0", "seesaw_window=0 must be >= 1"),
        ("scheduler.seesaw_consecutive=0", "seesaw_consecutive=0 must be >= 1"),
        ("scheduler.seesaw_temperature_scale=0.8", "seesaw_temperature_scale=0.8 must be >= 1"),
        ("scheduler.learn_ucb=-0.1", "learn_ucb=-0.1 must be >= 0"),
        ("scheduler.learn_power=0", r"learn_power=0.0 must be in \(0, 8\]"),
    ],
)
def test_bad_config_fails_at_load(override, message):
    with pytest.raises(ValueError, match=message):
        load_config(None, [override])


def test_bad_config_against_domains():
    with pytest.raises(ValueError, match=r"floor=0.3 times 4 domains is above 1"):
        DomainScheduler(SchedulerConfig(floor=0.3), domains(4), seed=0)
    with pytest.raises(ValueError, match="'x/\\*' matches no"):
        DomainScheduler(SchedulerConfig(policy="static", weights={"x/*": 1.0}), domains(4), 0)
    sched = DomainScheduler(SchedulerConfig(), domains(2), seed=0)
    with pytest.raises(ValueError, match="unknown domain 'nope'"):
        sched.observe(0, [result("nope", [1.0])])


def test_metrics_and_radar_png(tmp_path):
    sched = DomainScheduler(SchedulerConfig(), domains(6), seed=0)
    feed(sched, {"g0/d0": 0.25}, step=0, groups=1)
    m = sched.metrics()
    assert m["sched/g0/d0/weight"] == pytest.approx(1 / 6)
    assert m["sched/g0/d0/reward_mean"] == pytest.approx(0.25)
    assert m["sched/g0/d0/temperature"] == pytest.approx(1.0)
    assert m["sched/g0/d0/level"] == 0
    sched.observe_eval(0, {n: [0.2, 0.4] for n in sched.names})
    sched.observe_eval(1, {n: [0.6, 0.8] for n in sched.names})
    from megatron_rl.scheduler.radar import group_means

    groups, now = group_means(sched.domains, sched.guard.last_mean)
    assert groups == ["g0", "g1", "g2"] and now == pytest.approx([0.7] * 3)
    out = sched.radar_png(tmp_path / "radar" / "step1.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 5000
