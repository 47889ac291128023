"""The many-domain setting (issue 40): the difficulty ladders, the registered screen and its
primary set, the study's statistics, the heatmap and the thinned per-domain metric rows."""

from __future__ import annotations

import json
import math
import random

import pytest

from benchmarks.studies import many_stats as ms
from benchmarks.studies.many_report import report
from benchmarks.studies.many_screen import SCREEN, classify, family_of, load_screen, primary_set
from benchmarks.studies.stored_runs import differences
from domains.ladders import LADDERS, ladder_domains, ladder_of
from megatron_rl.controller.controller import without_domain_rows
from megatron_rl.scheduler.heatmap import heatmap_data, heatmap_png


def test_ladders_register_hundreds_of_distinct_single_level_domains() -> None:
    doms = ladder_domains()
    names = [d.name for d in doms]
    assert len(names) >= 200 and len(set(names)) == len(names)
    assert all(d.levels == (0,) and d.tags[1] == "ladder" for d in doms)
    assert {ladder_of(n) for n in names} == set(LADDERS)
    assert ladder_of("ladder/leg_counting_one_animals3") == "leg_counting_one"  # longest prefix


@pytest.mark.parametrize("ladder", sorted(LADDERS))
def test_every_rung_draws_tasks_its_verifier_accepts_in_both_splits(ladder: str) -> None:
    for d in ladder_domains():
        if ladder_of(d.name) != ladder:
            continue
        for split in ("train", "eval"):
            for i in range(3):
                t = d.task(split, i, 0, 5)
                assert t.split == split and len(t.gold.encode()) <= 24, (d.name, t.gold)
                assert d.verify(t, t.gold).score == 1.0, (d.name, t.prompt, t.gold)
                assert d.verify(t, t.gold + "x").score == 0.0


def test_classes_and_the_primary_set_follow_the_registered_rules() -> None:
    assert classify(0.95, 1.0) == "saturated" and classify(0.0, 0.0) == "out_of_reach"
    assert classify(0.01, 1 / 64) == "frontier"
    rungs = [f"ladder/gcd_{r}" for r, _ in LADDERS["gcd"][2]]
    classes = {n: "out_of_reach" for n in rungs} | {rungs[0]: "frontier", rungs[2]: "frontier"}
    classes |= {"rg/gcd@0": "frontier", "rg/gcd@1": "out_of_reach"}
    # frontier domains, then the first out-of-reach rung above the ladder's hardest frontier one
    assert primary_set(classes) == sorted([rungs[0], rungs[2], rungs[3], "rg/gcd@0"])


def test_the_registered_screen_is_consistent_and_mostly_outside_the_frontier() -> None:
    doc = load_screen(SCREEN)  # raises if its primary set disagrees with its classes
    classes = {d: r["class"] for d, r in doc["domains"].items()}
    assert len(classes) >= 200
    assert all(
        classify(r["pass1_t1"], r["pass16_t1"]) == r["class"] for r in doc["domains"].values()
    )
    assert sum(c != "frontier" for c in classes.values()) > len(classes) / 2
    assert family_of("rg/gcd@2") == "rg/gcd" and family_of("ladder/gcd_max50") == "gcd"


def _run(accs: list[dict[str, float]], generated: int = 32) -> dict:
    sweeps = [{"step": 10 * i, "acc": a, "se": dict.fromkeys(a, 0.01)} for i, a in enumerate(accs)]
    n = 10 * (len(accs) - 1)
    return {
        "sweeps": sweeps,
        "generated": [generated] * n,
        "trained": [4] * n,
        "signal": [4] * n,
        "events": [{"step": 10, "event": "regression", "domain": "b"}],
    }


def test_run_statistics_regressions_target_and_paired_differences() -> None:
    run = _run([{"a": 0.1, "b": 0.5}, {"a": 0.2, "b": 0.6}, {"a": 0.3, "b": 0.4}])
    st = ms.run_stats(run, ["a"], {"a": "fa", "b": "fb"}, group=8)
    assert st["primary"] == pytest.approx(0.3) and st["all"] == pytest.approx(0.35)
    assert st["regressions"] == ["b"] and st["guard_confirmed"] == 1  # 0.6 -> 0.4: > 2 SE
    assert st["worst_family"] == "fa" and st["signal_share"] == pytest.approx(4 / 32)
    assert st["rollouts_to_target"] == 10 * 32 * 8  # +0.1 by the first sweep after step 0
    small = _run([{"a": 0.1, "b": 0.5}, {"a": 0.1, "b": 0.51}, {"a": 0.1, "b": 0.49}])
    assert (
        ms.regressions(small) == []
        and ms.run_stats(small, ["a"], {}, 8)["rollouts_to_target"] is None
    )


def test_stats_recompute_detects_a_changed_number() -> None:
    screen = {"primary": ["a"], "domains": {"a": {}, "b": {}}}
    rng = random.Random(0)
    runs = {
        arm: {
            str(s): _run([{"a": 0.1, "b": 0.5}, {"a": 0.1 + rng.random() / 10, "b": 0.5}])
            for s in (1, 2, 3)
        }
        for arm in (ms.BASELINE, "oracle")
    }
    doc = {"sections": {"headroom": {"settings": {"group": 8}, "runs": runs}}}
    doc["stats"] = json.loads(json.dumps(ms.compute(doc, screen)))
    paired = doc["stats"]["headroom"]["arms"]["oracle"]["vs_baseline_primary"]
    assert paired["n"] == 3 and math.isfinite(paired["lower95"])
    assert differences(json.loads(json.dumps(ms.compute(doc, screen))), doc["stats"]) == []
    runs["oracle"]["2"]["sweeps"][-1]["acc"]["a"] += 0.05
    assert differences(json.loads(json.dumps(ms.compute(doc, screen))), doc["stats"])


def _arm(gains: list[float], regress: bool = False) -> dict:
    """One synthetic arm over seeds 1..n: domain a gains gains[i]; b falls by 0.2 if regress."""
    end_b = 0.3 if regress else 0.5
    return {
        str(s): _run([{"a": 0.1, "b": 0.5}, {"a": 0.1 + g, "b": end_b}])
        for s, g in enumerate(gains, 1)
    }


def test_report_pairs_the_two_parts_and_decides_the_win_only_on_every_seed() -> None:
    screen = {"primary": ["a"], "domains": {"a": {}, "b": {}}}
    base = [0.00, 0.01, 0.00, 0.02]
    headroom = {ms.BASELINE: _arm(base), "oracle": _arm([0.05] * 4)}
    arms = {
        "adaptive": _arm([0.03, 0.05, 0.04, 0.06]),
        "pre-screen": _arm([0.04, 0.05, 0.05, 0.06]),
    }
    sections = {
        "headroom": {"settings": {"group": 8}, "runs": headroom},
        "arms": {"settings": {"group": 8}, "runs": arms},
    }
    rep = ms.compute({"sections": sections}, screen)["report"]
    assert set(rep["arms"]) == {ms.BASELINE, "oracle", "adaptive", "pre-screen"}
    gain = rep["arms"]["adaptive"]["vs_baseline_primary"]
    assert gain["n"] == 4 and gain["mean"] == pytest.approx(0.0375)
    vs_pre = rep["contrasts"]["adaptive - pre-screen"]["primary"]
    assert vs_pre["mean"] == pytest.approx(-0.005)  # lower bound below -0.005: fails
    win = rep["win"]
    assert win["complete"] and not win["met"]
    assert [v["holds"] for v in win["criteria"].values()] == [True, False, True, True]
    arms["pre-screen"] = _arm([0.03, 0.05, 0.04, 0.06])  # equal to adaptive: lb 0 > -0.005
    doc = {
        "sections": sections,
        "stats": json.loads(json.dumps(ms.compute({"sections": sections}, screen))),
    }
    assert doc["stats"]["report"]["win"]["met"]
    table = report(doc, screen, "report")
    assert "the win (registered, all three): met" in table and "adaptive - pre-screen" in table
    arms["adaptive"] = _arm([0.03, 0.05, 0.04, 0.06], regress=True)  # more regressions
    assert not ms.compute({"sections": sections}, screen)["report"]["win"]["met"]
    del arms["adaptive"]["4"]  # three of four seeds: nothing is decided
    win = ms.compute({"sections": sections}, screen)["report"]["win"]
    assert not win["complete"] and not win["met"]
    arms[ms.BASELINE] = arms.pop("pre-screen")
    with pytest.raises(ValueError, match="in both sections"):
        ms.compute({"sections": sections}, screen)
    sections["arms"]["settings"] = {"group": 4}
    with pytest.raises(ValueError, match="differ in settings"):
        ms.compute({"sections": sections}, screen)


def test_screened_part_pairs_its_contrast_and_refuses_two_screens_of_one_seed() -> None:
    screen = {"primary": ["a"], "domains": {"a": {}, "b": {}}}
    runs = {
        ms.BASELINE: _arm([0.00, 0.01, 0.00]),
        "pre-screen (in the run)": _arm([0.02, 0.03, 0.02]),
        "pre-screen + adaptive": _arm([0.03, 0.05, 0.04]),
    }
    for arm in ("pre-screen (in the run)", "pre-screen + adaptive"):
        for run in runs[arm].values():
            run["prescreen"] = {"groups": 4, "domains": ["a"]}
    report_part = {
        ms.BASELINE: _arm([0.00, 0.01, 0.00]),
        "pre-screen": _arm([0.01, 0.02, 0.01]),
    }
    doc = {
        "sections": {
            "screened": {"settings": {"group": 8}, "runs": runs},
            "headroom": {"settings": {"group": 8}, "runs": {}},
            "arms": {"settings": {"group": 8}, "runs": {}},
        }
    }
    doc["sections"]["headroom"]["runs"] = {ms.BASELINE: report_part[ms.BASELINE]}
    doc["sections"]["arms"]["runs"] = {"pre-screen": report_part["pre-screen"]}
    rep = ms.compute(doc, screen)["replication"]
    assert rep["seeds"] == {"report": 3, "screened": 3} and not rep["complete"]
    assert rep["fresh"]["mean"] == pytest.approx(0.02) and rep["pooled"]["n"] == 6
    assert rep["pooled"]["mean"] == pytest.approx(0.015) and rep["holds"]
    st = ms.compute(doc, screen)["screened"]
    c = st["contrasts"]["pre-screen + adaptive - pre-screen (in the run)"]["primary"]
    assert c["n"] == 3 and c["mean"] == pytest.approx(0.05 / 3)
    assert st["arms"]["pre-screen (in the run)"]["vs_baseline_primary"]["mean"] == pytest.approx(
        0.02
    )
    # the screen's groups count as generated: 4 more than the 320 of the steps
    assert st["runs"]["pre-screen + adaptive"]["1"]["generated"] == 324
    # the adaptive mix on top: +0.01, +0.02, +0.02 (lower bound > 0), no domain worse
    assert st["on_top"] == {"holds": True, "complete": False}  # 3 of the 8 registered seeds
    assert st["win"]["met"] and st["win"]["complete"]  # every seed the part has
    doc["stats"] = json.loads(json.dumps(ms.compute(doc, screen)))
    table = report(doc, screen, "screened")
    assert "pre-screen + adaptive - pre-screen (in the run), primary" in table
    assert "replication of the pre-screen (registered): not decided yet (holds so far)" in table
    assert "adaptive mix on top of the pre-screen (registered): not decided yet (holds" in table
    assert "the win (the issue's criteria, descriptive here, all three): met" in table
    runs["pre-screen + adaptive"] = _arm([0.03, 0.05, 0.04], regress=True)  # b falls by 0.2
    for run in runs["pre-screen + adaptive"].values():
        run["prescreen"] = {"groups": 4, "domains": ["a"]}
    st = ms.compute(doc, screen)["screened"]
    assert not st["on_top"]["holds"] and not st["win"]["met"]  # more regressions, all worse
    runs["pre-screen + adaptive"]["2"]["prescreen"]["domains"] = ["a", "b"]
    with pytest.raises(ValueError, match="seed 2: .* kept other domains than"):
        ms.compute(doc, screen)


def test_heatmap_groups_rows_by_family_keeps_ladder_order_and_marks_events(tmp_path) -> None:
    names = ["ladder/gcd_max25", "ladder/gcd_max30", "ladder/add_t2_d2", "rg/gcd@0"]
    rows = []
    for step, base in ((0, 0.1), (5, 0.2), (10, 0.3)):
        r = {"step": step, "eval/mean_accuracy": base}
        r |= {f"eval/{n}/accuracy": base + i / 100 for i, n in enumerate(names)}
        rows.append(r)
    rows.append({"step": 7, "loss/total": 1.0})
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    event = {"step": 7, "event": "regression", "domain": "ladder/gcd_max30", "score": 0.2}
    (tmp_path / "events.jsonl").write_text(json.dumps(event) + "\n")
    groups = {n: family_of(n) for n in names}
    d = heatmap_data(tmp_path, groups)
    assert d.names == ["ladder/add_t2_d2", "ladder/gcd_max25", "ladder/gcd_max30", "rg/gcd@0"]
    assert d.steps == [0, 5, 10] and d.acc.shape == (4, 3)
    assert d.acc[1, 2] == pytest.approx(0.3) and d.marks == [(2, 1, "regression")]
    assert heatmap_png(tmp_path, groups=groups).stat().st_size > 1000


def test_per_domain_rows_are_dropped_and_the_aggregates_kept() -> None:
    m = {
        "sched/ladder/gcd_max25/weight": 0.1,
        "rollout/rg/gcd@0/accuracy": 0.5,
        "monitor/tiny/x/reward_mean": 1.0,
        "rollout/groups_generated": 32.0,
        "sched/mix_entropy": 2.0,
        "loss/total": 0.3,
    }
    out = without_domain_rows(m, ["ladder/gcd_max25", "rg/gcd@0", "tiny/x"])
    assert out == {"rollout/groups_generated": 32.0, "sched/mix_entropy": 2.0, "loss/total": 0.3}


def test_spell_backward_pays_the_word_only_at_every_length() -> None:
    """reasoning-gym's scorer summed 1/len per matching letter and took its prefix penalty only
    at a sum of exactly 1.0: 9-, 11-, 18- and 20-letter words followed by junk scored 1.0."""
    from megatron_rl.domains import load_domains

    rg = load_domains(["rg/spell_backward@*"])
    seen = set()
    for d in [*rg.values(), *[x for x in ladder_domains() if "spell_backward" in x.name]]:
        for i in range(40):
            t = d.task("train", i, d.levels[0], 3)
            seen.add(len(t.gold))
            assert d.verify(t, t.gold).score == 1.0
            assert d.verify(t, t.gold + "x").score == 0.0, (d.name, t.gold)
            assert d.verify(t, t.gold.upper()).score == 1.0
    assert {9, 11} & seen
