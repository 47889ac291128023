"""The run's pictures: radar axes (per group, or per domain when groups are too few) and the
per-domain held-out curves with seesaw events, asserted on the data behind each plot."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from megatron_rl.scheduler import DomainInfo, DomainScheduler, SchedulerConfig
from megatron_rl.scheduler.curves import curve_data, curves_png, seesaw_png
from megatron_rl.scheduler.radar import radar_data

DEMO = [DomainInfo(f"tiny/{g}", tags=["tiny", "reasoning_gym"]) for g in "abcd"]


def test_radar_one_axis_per_domain_when_one_group() -> None:
    start = np.array([0.2, 0.3, 0.1, 0.9])
    now = np.array([0.3, 0.5, 0.5, 0.9])
    data = radar_data(DEMO, start, now)
    assert data.mode == "domain"
    assert data.labels == ["a", "b", "c", "d"]
    np.testing.assert_allclose(data.start, start)
    np.testing.assert_allclose(data.now, now)


def test_radar_two_groups_still_per_domain_and_skips_unevaluated() -> None:
    doms = DEMO[:2] + [DomainInfo("mix/x", tags=["mix"]), DomainInfo("mix/y", tags=["mix"])]
    start = np.array([0.2, np.nan, 0.4, 0.6])
    data = radar_data(doms, start, start + 0.1)
    assert data.mode == "domain" and data.labels == ["a", "x", "y"]  # tiny/b never evaluated
    np.testing.assert_allclose(data.now, [0.3, 0.5, 0.7])


def test_radar_groups_when_three_or_more() -> None:
    doms = [DomainInfo(f"{f}/{i}", tags=[f]) for f in ("m", "c", "s") for i in range(2)]
    start = np.array([0.1, 0.3, 0.5, 0.7, 0.0, 1.0])
    data = radar_data(doms, start, start)
    assert data.mode == "group" and data.labels == ["c", "m", "s"]
    np.testing.assert_allclose(data.start, [0.6, 0.2, 0.5])


def test_scheduler_radar_png_from_its_sweeps(tmp_path: Path) -> None:
    sched = DomainScheduler(SchedulerConfig(), DEMO, seed=0)
    sched.observe_eval(0, {d.name: [0.0, 1.0, 0.0, 0.0] for d in DEMO})
    sched.observe_eval(5, {d.name: [1.0, 1.0, 0.0, 0.0] for d in DEMO})
    out = sched.radar_png(tmp_path / "radar.png")
    assert out.stat().st_size > 5_000
    data = radar_data(sched.domains, sched.guard.start_mean, sched.guard.last_mean)
    np.testing.assert_allclose(data.start, [0.25] * 4)
    np.testing.assert_allclose(data.now, [0.5] * 4)


def write_run(run: Path) -> None:
    """metrics.jsonl rows as the RL loop writes them (eval sweeps, sched metrics) + events."""
    rows = []
    for step, (a, b) in enumerate([(0.2, 0.6), (0.4, 0.7), (0.5, 0.4), (0.6, 0.65)]):
        s = step * 10
        rows.append({"step": s, "eval/tiny/a/accuracy": a, "eval/tiny/b/accuracy": b})
        rows.append({"step": s, "eval/mean_accuracy": (a + b) / 2, "sched/tiny/b/weight": 0.5})
        rows.append({"step": s + 1, "sched/tiny/b/weight": 0.5 + step / 10})
        rows.append({"step": s + 1, "sched/tiny/b/temperature": 1.0 + step / 10})
    run.mkdir(parents=True, exist_ok=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    events = [
        {"step": 20, "event": "regression", "domain": "tiny/b", "score": 0.4, "best": 0.7},
        {"step": 30, "event": "recovery", "domain": "tiny/b", "score": 0.65},
        {"step": 30, "event": "promote", "domain": "tiny/a", "level": 1},
    ]
    (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))


def test_curve_data_points_and_event_marks(tmp_path: Path) -> None:
    write_run(tmp_path)
    data = curve_data(tmp_path)
    assert sorted(data.curves) == ["tiny/a", "tiny/b"]  # eval/mean_accuracy is not a domain
    assert data.curves["tiny/a"] == [(0, 0.2), (10, 0.4), (20, 0.5), (30, 0.6)]
    assert data.curves["tiny/b"][2] == (20, 0.4)
    # promote is not a seesaw event; regression sits on the curve at its step
    assert data.marks == [(20, "tiny/b", "regression", 0.4), (30, "tiny/b", "recovery", 0.65)]
    out = curves_png(tmp_path)
    assert out == tmp_path / "eval_curves.png" and out.stat().st_size > 10_000


def test_curves_of_an_empty_run_and_seesaw_of_unknown_domain(tmp_path: Path) -> None:
    assert curve_data(tmp_path).curves == {}
    assert curves_png(tmp_path).is_file()  # an empty frame, not a crash
    write_run(tmp_path)
    with pytest.raises(ValueError, match="tiny/zzz"):
        seesaw_png(tmp_path, "tiny/zzz", tmp_path / "s.png")
    assert seesaw_png(tmp_path, "tiny/b", tmp_path / "s.png").stat().st_size > 10_000


def test_curves_cli_finds_the_regressed_domain(tmp_path: Path, capsys) -> None:
    from megatron_rl.scheduler.curves import main

    write_run(tmp_path)
    assert main([str(tmp_path), "--seesaw", str(tmp_path / "seesaw.png")]) == 0
    assert (tmp_path / "seesaw.png").is_file() and "seesaw.png" in capsys.readouterr().out
    (tmp_path / "events.jsonl").write_text("")
    with pytest.raises(SystemExit, match="no regression event"):
        main([str(tmp_path), "--seesaw", str(tmp_path / "x.png")])


def test_seesaw_panel_with_a_counterfactual_run_and_the_partner_domain(tmp_path: Path) -> None:
    write_run(tmp_path / "guard")
    write_run(tmp_path / "noguard")
    png = tmp_path / "s.png"
    plain = seesaw_png(tmp_path / "guard", "tiny/b", png).stat().st_size
    both = seesaw_png(tmp_path / "guard", "tiny/b", png, (tmp_path / "noguard",), "tiny/a")
    assert both.stat().st_size > plain  # the dashed run, the dotted partner and their legends
    with pytest.raises(ValueError, match="tiny/zzz"):
        seesaw_png(tmp_path / "guard", "tiny/b", png, partner="tiny/zzz")
