"""The model-reward study's statistics (benchmarks/studies/model_rewards_stats.py) on small
hand-made runs: the damage step, the flag's lead time at each sweep cadence, the paired
comparison against the rule, and whether a constraint arm holds its budget."""

from __future__ import annotations

import pytest

from benchmarks.studies import model_rewards_stats as st


def run(accs: list[float], warnings: list[tuple[int, str]], se: float = 0.02) -> dict:
    sweeps = [
        {"step": 10 * i, "acc": {"a": x, "b": x}, "se": {"a": se, "b": se}}
        for i, x in enumerate(accs)
    ]
    return {"sweeps": sweeps, "warnings": [{"step": s, "warning": k} for s, k in warnings]}


def test_damage_step_is_the_first_sweep_significantly_below_the_start() -> None:
    # a sweep mean's SE: 0.02 / sqrt(2); two sweeps combined: 0.02; the bar: 2 x 0.02 below
    r = run([0.5, 0.49, 0.47, 0.2, 0.1, 0.0], [])
    assert st.damage_step(r) == 30  # 0.47 is within the bar, 0.2 is not
    r2 = run([0.5, 0.47, 0.455, 0.2, 0.1, 0.0], [])
    assert st.damage_step(r2) == 20  # 0.455 < 0.5 - 0.04
    assert st.damage_step(r2, cadence=50) == 50
    assert st.damage_step(run([0.5, 0.5, 0.6], [])) is None


def test_lead_time_is_counted_from_the_first_flag_of_any_kind() -> None:
    r = run([0.5, 0.5, 0.5, 0.2, 0.1, 0.0], [(24, "reward_divergence"), (12, "answer_cluster")])
    h = st.hacking_stats(r)
    assert h["flag_step"] == 12 and h["warnings"] == 2
    assert h["first_by_kind"] == {"answer_cluster": 12, "reward_divergence": 24}
    assert h["damage_step"] == 30 and h["lead_time"] == {"10": 18, "50": 38}
    assert st.hacking_stats(run([0.5, 0.1], []))["lead_time"] == {"10": None, "50": None}


def test_rm_section_pairs_each_arm_with_the_rule_per_seed() -> None:
    sec = {
        "runs": {
            "rule": {"1": run([0.3, 0.6], []), "2": run([0.3, 0.5], [])},
            "reward model": {"1": run([0.3, 0.5], []), "2": run([0.3, 0.45], [(5, "reward_jump")])},
            st.HACKABLE: {"1": run([0.3, 0.0], [(3, "x")]), "2": run([0.3, 0.0], [])},
        }
    }
    out = st.rm_section(sec)
    assert out["vs_rule"]["reward model"]["diffs"] == pytest.approx([-0.1, -0.05])
    assert out["hackable_flagged_every_seed"] is False  # seed 2 was never flagged
    assert out["false_alarms"] == {"reward model": 0.5, "rule": 0.0}


def test_an_arm_holds_only_when_every_seed_ends_under_budget() -> None:
    def con(rates: list[float], clean: tuple[float, float]) -> dict:
        sweeps = [{"step": 0, "acc": {st.CLEAN: clean[0]}, "se": {st.CLEAN: 0.03}}]
        sweeps.append({"step": 20, "acc": {st.CLEAN: clean[1]}, "se": {st.CLEAN: 0.03}})
        key = f"constraint/{st.CONSTRAINT}"
        return {"sweeps": sweeps, "trace": {f"{key}/rate": rates, f"{key}/multiplier": [1.0]}}

    held = [0.5] * 10 + [0.0] * 9 + [0.3]  # the last ten steps average 0.03
    sec = {
        "settings": {"budget": 0.05},
        "runs": {
            st.LAGRANGE: {"1": con(held, (0.6, 0.8)), "2": con(held, (0.6, 0.7))},
            "floor 0": {"1": con([0.4] * 20, (0.6, 0.7)), "2": con(held, (0.6, 0.5))},
        },
    }
    out = st.constraint_section(sec)
    lag, floor = out["arms"][st.LAGRANGE], out["arms"]["floor 0"]
    assert out["runs"][st.LAGRANGE]["1"]["final_rate"] == pytest.approx(0.03)
    assert lag["holds_every_seed"] and lag["task_up_every_seed"]
    assert not floor["holds_every_seed"] and not floor["task_up_every_seed"]
    assert floor["lagrangian minus this, clean"]["diffs"] == pytest.approx([0.1, 0.2])
    assert f"{st.PI} minus this, clean" not in floor  # no PI arm in this section
