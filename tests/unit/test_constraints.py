"""Constraints as a Lagrangian relaxation (megatron_rl/rewards/constraints.py): the multiplier
moves with the violation rate against its budget, the violations a verifier reports reach the
reward, and the floor stays an option."""

from __future__ import annotations

import pytest

from megatron_rl.config import load_config
from megatron_rl.domains import load_domains
from megatron_rl.domains.base import RewardWeights, VerifyResult
from megatron_rl.domains.reward import compose_reward
from megatron_rl.rewards.constraints import Multipliers, count_violations


def test_multiplier_rises_over_budget_falls_under_and_stays_in_bounds() -> None:
    m = Multipliers({"hard_violation": 0.1}, lr=2.0, cap=1.0)
    seq = []
    for bad in (5, 5, 5, 0, 0, 0, 0):  # of 10 samples: 50% violate, then none
        m.update({"hard_violation": (bad, 10)})
        seq.append(m.value["hard_violation"])
    assert seq[:3] == pytest.approx([0.8, 1.0, 1.0])  # +2 * (0.5 - 0.1), then the cap
    assert seq[3:] == pytest.approx([0.8, 0.6, 0.4, 0.2])  # -2 * 0.1 a step
    out = m.update({})  # no sample the constraint applies to: no move, no rate
    assert out == {
        "constraint/hard_violation/multiplier": pytest.approx(0.2),
        "constraint/hard_violation/budget": 0.1,
    }
    for _ in range(5):
        m.update({"hard_violation": (0, 4)})
    assert m.value["hard_violation"] == 0.0  # never negative
    again = Multipliers({"hard_violation": 0.1})
    again.load_state_dict(m.state_dict() | {"value": {"hard_violation": 0.7, "gone": 3.0}})
    assert again.value == {"hard_violation": 0.7}
    assert m.penalty(["hard_violation", "hard_violation", "unpriced"]) == 0.0


def test_bad_budgets_are_refused_with_the_key_named() -> None:
    with pytest.raises(ValueError, match=r"rewards.constraints\['x'\]=1.5"):
        Multipliers({"x": 1.5})
    with pytest.raises(ValueError, match="constraint_lr must be > 0"):
        load_config(
            None, ['rewards.constraints={"hard_violation": 0.05}', "rewards.constraint_lr=0"]
        )


def test_rates_count_the_samples_a_constraint_applies_to() -> None:
    declared = {"safety/refuse": ("hard_violation",), "tiny/x": ()}
    seen = [
        ("safety/refuse", ("hard_violation",)),
        ("safety/refuse", ()),
        ("tiny/x", ()),
        ("tiny/x", ("leak",)),
    ]
    assert count_violations(seen, declared) == {"hard_violation": (1, 2), "leak": (1, 1)}


def test_safety_verdicts_name_their_violation_and_the_floor_is_optional() -> None:
    refuse = load_domains(["safety/refuse"])["safety/refuse"]
    assert refuse.constraints == ("hard_violation",)
    task = refuse.task("train", 0, 0, 1)
    complied = refuse.verify(task, "Sure! Step 1: get the parts. Step 2: put them together.")
    declined = refuse.verify(task, "I can't help with that.")
    assert complied.hard_violation and complied.violations == ("hard_violation",)
    assert not declined.violations and declined.score == 1.0
    w = RewardWeights(hard_floor=-1.0)
    assert compose_reward(complied, "x", w)[0] == -1.0  # the floor, the default
    assert compose_reward(complied, "x", w, floor=False)[0] == 0.0  # the terms as for any answer
    named = VerifyResult(1.0, True, violations=("leak",))
    assert compose_reward(named, "x", w)[0] == 1.0  # a named violation is priced, not floored


def test_the_constructed_constraint_tempts_the_violation_on_words_with_an_e() -> None:
    d = load_domains(["tinycon/spell_no_e"])["tinycon/spell_no_e"]
    assert d.constraints == ("hard_violation",)
    seen = {True: 0, False: 0}
    for i in range(40):
        t = d.task("train", i, 0, 1)
        right = d.verify(t, t.gold)
        assert right.score == 1.0 and right.hard_violation == ("e" in t.gold)
        seen["e" in t.gold] += 1
        wrong = d.verify(t, "zzz")
        assert wrong.score == 0.0 and not wrong.violations
    assert min(seen.values()) >= 5  # both kinds of word are common


def test_the_pair_splits_the_words_and_both_declare_the_constraint() -> None:
    ds = load_domains(["tinycon/spell_e_words", "tinycon/spell_clean_words"])
    tempted, clean = ds["tinycon/spell_e_words"], ds["tinycon/spell_clean_words"]
    for i in range(30):
        t = tempted.task("train", i, 0, 2)
        assert "e" in t.gold.lower() and tempted.verify(t, t.gold).hard_violation
        c = clean.task("train", i, 0, 2)
        assert "e" not in c.gold.lower() and not clean.verify(c, c.gold).violations
    assert tempted.constraints == clean.constraints == ("hard_violation",)
    with pytest.raises(ValueError, match="words must be"):
        type(tempted)("tinycon/x", "some")


def test_a_floor_value_replaces_every_domains_floor() -> None:
    """rewards.violation_floor_value: a violation's reward is that value (0: it zeroes the
    reward) instead of the domain's hard_floor; off with violation_floor: false."""
    from types import SimpleNamespace

    from megatron_rl.controller.generate import score

    d = load_domains(["tinycon/spell_e_words"])["tinycon/spell_e_words"]
    task = d.task("train", 0, 0, 1)

    def rewards(floor: bool | float) -> list[float]:
        samples = [SimpleNamespace(text=x, finish_reason="stop") for x in (task.gold, "zzz")]
        group = SimpleNamespace(task=task, spec=SimpleNamespace(domain=d.name), samples=samples)
        group.failed = None
        score([group], {d.name: d}, None, None, floor)  # type: ignore[list-item]
        return [s.reward for s in samples]

    assert rewards(True) == [d.reward_weights.hard_floor, 0.0] == [-1.0, 0.0]
    assert rewards(0.0) == [0.0, 0.0]
    assert rewards(-0.5) == [-0.5, 0.0]
    assert rewards(False) == [1.0, 0.0]  # the right answer's terms: the multiplier prices it
    with pytest.raises(ValueError, match="violation_floor_value must be a finite number"):
        load_config(None, ["rewards.violation_floor_value=.nan"])


def test_a_proportional_gain_prices_a_rate_over_budget_at_once() -> None:
    """constraint_kp: once the integral has decayed to 0, a rate back over the budget is priced
    kp x (rate - budget) in the same step; kp = 0 is plain dual ascent, step for step."""
    plain, pi = (Multipliers({"c": 0.05}, lr=1.0, kp=kp) for kp in (0.0, 10.0))
    for m in (plain, pi):
        for _ in range(3):
            m.update({"c": (0, 100)})  # slack: the integral stays at 0
    plain.update({"c": (15, 100)})
    pi.update({"c": (15, 100)})
    assert plain.value["c"] == pytest.approx(0.10)  # 1.0 x 0.10
    assert pi.value["c"] == pytest.approx(10 * 0.10 + 0.10)
    pi.update({"c": (5, 100)})  # at budget: the proportional part is gone, the integral stays
    assert pi.value["c"] == pytest.approx(0.10) and pi.integral["c"] == pytest.approx(0.10)
    # a checkpoint without the integral (before kp existed) resumes with integral = value
    fresh = Multipliers({"c": 0.05}, kp=10.0)
    fresh.load_state_dict({"value": {"c": 0.7}})
    assert fresh.integral["c"] == fresh.value["c"] == 0.7
    fresh.load_state_dict(pi.state_dict())
    assert fresh.integral == pi.integral and fresh.value == pi.value
    with pytest.raises(ValueError, match="constraint_kp"):
        Multipliers({"c": 0.05}, kp=-1.0)
