"""The simulator used by benchmarks/studies/scheduler_sim.py: its dynamics do what its docstring
says."""

from __future__ import annotations

import numpy as np

from megatron_rl.scheduler import GroupResult, SchedulerConfig
from megatron_rl.scheduler.sim import DomainSim, SimConfig, simulate

SMALL = SimConfig(n_domains=20, n_clusters=4, eval_tasks=12)


def test_training_improves_a_domain_and_zero_variance_groups_teach_nothing():
    cfg = SimConfig(
        n_domains=20, n_clusters=4, drift=0.0, cross_mean=0.0, cross_std=0.0, conflict_frac=0.0
    )
    sim = DomainSim(cfg, seed=0)
    before = sim.skill.copy()
    sim.train([GroupResult(sim.names[0], 0, [1.0] * 8, [1] * 8, [False] * 8)])
    np.testing.assert_array_equal(sim.skill, before)  # all-equal rewards: no update
    sim.train([GroupResult(sim.names[0], 0, [1.0, 0.0] * 4, [1] * 8, [False] * 8)])
    delta = sim.skill - before
    assert delta[0] > 0
    mates = sim.cluster == sim.cluster[0]
    mates[0] = False
    assert np.all(delta[mates] > 0) and np.all(delta[mates] < delta[0])  # transfer in-cluster
    assert np.all(delta[sim.cluster != sim.cluster[0]] == 0)  # interference switched off


def test_conflicting_cluster_is_hurt():
    cfg = SimConfig(n_domains=20, n_clusters=2, drift=0.0, cross_std=0.0, conflict_frac=1.0)
    sim = DomainSim(cfg, seed=0)
    before = sim.skill.copy()
    sim.train([GroupResult(sim.names[0], 0, [1.0, 0.0] * 4, [1] * 8, [False] * 8)])
    other = sim.cluster != sim.cluster[0]
    assert np.all(sim.skill[other] < before[other])


def test_eval_scores_are_noisy_around_the_expected_accuracy():
    sim = DomainSim(SimConfig(n_domains=5, eval_tasks=300, eval_samples=4), seed=0)
    scores = np.array([sim.eval_scores()[n] for n in sim.names]).mean(axis=1)
    np.testing.assert_allclose(scores, sim.expected_eval(), atol=0.05)


def test_simulate_runs_and_learns():
    out = simulate(SchedulerConfig(), SMALL, seed=0, steps=40, num_groups=16, eval_every=10)
    assert out.rollouts == 40 * 16
    assert out.final.mean() > out.start.mean() + 0.05
    assert np.all(out.best >= out.final - 1e-12)


def test_interference_erodes_less_from_a_domain_near_zero():
    cfg = SimConfig(n_domains=20, n_clusters=2, drift=0.0, cross_std=0.0, conflict_frac=1.0)
    sim = DomainSim(cfg, seed=0)
    other = np.flatnonzero(sim.cluster != sim.cluster[0])
    sim.skill[other[0]], sim.skill[other[1]] = -6.0, 2.0  # ~0% vs ~88% level-0 pass rate
    before = sim.skill.copy()
    sim.train([GroupResult(sim.names[0], 0, [1.0, 0.0] * 4, [1] * 8, [False] * 8)])
    loss = before - sim.skill
    assert 0 < loss[other[0]] < 0.01 * loss[other[1]]


def test_benchmark_table_leads_with_the_same_budget_baseline():
    """benchmarks/studies/scheduler_sim.py: the first row generates as many rollouts as the adaptive
    scheduler, and the seeds it reports were never used for development."""
    from benchmarks.studies import scheduler_sim as bench

    first, (cfg, mult) = next(iter(bench.CONFIGS.items()))
    assert first == bench.BASELINE and mult == 1
    assert not set(bench.REPORT_SEEDS) & set(bench.DEV_SEEDS) and len(bench.REPORT_SEEDS) >= 3
    runs = {
        name: simulate(bench.CONFIGS[name][0], SMALL, seed=0, steps=5, num_groups=8)
        for name in (bench.BASELINE, "adaptive (all features)", bench.UNIFORM)
    }
    assert runs[bench.BASELINE].rollouts == runs["adaptive (all features)"].rollouts == 80
    assert runs[bench.UNIFORM].rollouts == 40
    ada = np.array([[0.9, 0.5, 0.6, 1.0, 16], [0.8, 0.4, 0.5, 3.0, 16]])
    base = np.array([[0.8, 0.6, 0.6, 1.0, 16], [0.7, 0.3, 0.5, 2.0, 16]])
    line = bench.per_seed(ada, base, "b")
    assert "higher mean acc 2/2, higher worst 1/2, fewer regressions 0/2 (ties 1)" in line
