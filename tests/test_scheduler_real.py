"""benchmarks/scheduler_real.py (``make bench-scheduler``): same budget for every arm, the
numbers it reports from a run's own curves, and a smoke run of real training for every arm."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import scheduler_real as sr  # noqa: E402


def test_seeds_fixed_and_apart_and_arms_share_the_rollout_budget(tmp_path, monkeypatch) -> None:
    assert len(sr.REPORT_SEEDS) >= 3 and not set(sr.REPORT_SEEDS) & set(sr.DEV_SEEDS)
    _, a = sr.settings("mix", sr.parse(["--run-dir", str(tmp_path)]))
    assert sr.planned_groups(a, tmp_path) == dict.fromkeys(sr.ARMS, 32)  # 16 trained x 2
    assert len(a.domains) >= 10 and a.eval_n == 64
    arms = dict(sr.ARMS, cheap=[*sr.BUDGET, "scheduler.oversample=1.5"])
    monkeypatch.setattr(sr, "ARMS", arms)
    with pytest.raises(ValueError, match="different groups per step"):
        sr.planned_groups(a, tmp_path)


def write_run(run: Path) -> None:
    rows = [
        {"step": 0, "eval/d/a/accuracy": 0.2, "eval/d/b/accuracy": 0.5},
        {"step": 0, "rollout/samples": 32},
        {"step": 1, "rollout/samples": 32},
        {"step": 1, "eval/d/a/accuracy": 0.6, "eval/d/b/accuracy": 0.7},
        {"step": 2, "eval/d/a/accuracy": 0.59, "eval/d/b/accuracy": 0.4},
    ]
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "summary.json").write_text(json.dumps({"wall_s": 12.5}))
    (run / "events.jsonl").write_text(
        json.dumps({"step": 2, "event": "regression", "domain": "d/b"})
    )


def test_score_run_reads_the_runs_own_curves(tmp_path) -> None:
    write_run(tmp_path / "r")
    s = sr.score_run(tmp_path / "r", group_size=4)
    assert s["final"] == {"d/a": 0.59, "d/b": 0.4} and s["start"] == {"d/a": 0.2, "d/b": 0.5}
    assert s["mean_acc"] == pytest.approx(0.495) and s["worst_acc"] == 0.4
    assert s["regressions"] == 1 and s["regressed"] == ["d/b"]  # a: 1 point below its best
    assert s["rollouts_per_step"] == 8.0 and s["wall_s"] == 12.5
    assert [e["domain"] for e in s["seesaw_events"]] == ["d/b"]


def test_smoke_run_of_every_arm(tmp_path) -> None:
    """Real training (2 steps) of every arm of both experiments; nothing tracked is written."""
    out, runs = tmp_path / "s.json", tmp_path / "runs"
    args = ["--smoke", "--out", str(out), "--run-dir", str(runs), "--wandb", "disabled"]
    assert sr.main(args) == 0
    doc = json.loads(out.read_text())
    # dev seeds only, never written where report seeds go
    assert sorted(doc) == ["dev", "temperature"] and list(doc["temperature"]) == ["dev"]
    temp = doc["temperature"]["dev"]
    assert temp["domains"] == sr.TEMPERATURE_DOMAINS and set(temp["results"]) == set(
        sr.TEMPERATURE_ARMS
    )
    assert set(temp["generated_groups_per_step"].values()) == {4}
    for r in (r for runs in temp["results"].values() for r in runs.values()):
        assert sorted(r["mixed_share"]) == sorted(sr.TEMPERATURE_DOMAINS)
        assert sorted(r["mean_temperature"]) == sorted(sr.TEMPERATURE_DOMAINS)
    assert (tmp_path / "s_temperature.png").is_file()
    dev = doc["dev"]
    assert dev["seed_values"] == list(sr.DEV_SEEDS)
    assert set(dev["generated_groups_per_step"].values()) == {4}
    for arm in sr.ARMS:
        (r,) = dev["results"][arm].values()
        assert r["rollouts_per_step"] == 4.0
        assert 0.0 <= r["worst_acc"] <= r["mean_acc"] <= 1.0 and r["wall_s"] > 0
        assert sorted(r["final"]) == sorted(dev["domains"])
        run = Path(r["run_dir"])
        assert (run / "radar.png").is_file() and (run / "eval_curves.png").is_file()
    assert (tmp_path / "s_radar.png").is_file() and (tmp_path / "s_curves.png").is_file()
    status = subprocess.run(
        ["git", "status", "--porcelain", "benchmarks"], cwd=ROOT, capture_output=True, text=True
    )
    assert "scheduler_real" not in status.stdout.replace("scheduler_real.py", "")


def test_temperature_arms_differ_only_in_temperature_and_share_the_budget(tmp_path) -> None:
    a = sr.parse(["--run-dir", str(tmp_path)])
    arms, e = sr.settings("temperature", a)
    assert e.domains == sr.TEMPERATURE_DOMAINS and e.eval_n == 128
    assert len(set(sr.planned_groups(e, tmp_path, arms).values())) == 1
    fixed, adapt = arms.values()
    extra = [o for o in adapt if o not in fixed]
    assert extra and all(o.startswith("scheduler.temperature") for o in extra)
    assert set(fixed) <= set(adapt)


def test_seesaw_picture_prefers_the_constructed_pair_and_draws_nothing_without_events(
    tmp_path,
) -> None:
    def run(name: str, events: list[dict]) -> dict:
        d = tmp_path / name
        d.mkdir()
        rows = [
            {"step": s, "eval/tiny/x/accuracy": 0.3}
            | {f"eval/{dom}/accuracy": 0.5 - 0.1 * (s == 1) for dom in sr.PAIR}
            for s in range(3)
        ]
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (d / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
        return {"run_dir": str(d), "seesaw_events": events}

    ev = [
        {"step": 1, "event": "regression", "domain": "tiny/x"},
        {"step": 1, "event": "regression", "domain": "tinymix/add_last_digit"},
    ]
    results = {
        "adaptive": {"11": run("a11", ev[:1]), "12": run("a12", ev)},
        "adaptive, no seesaw guard": {"11": run("n11", []), "12": run("n12", [])},
    }
    (png,) = sr.draw_seesaw(results, tmp_path / "s.png")
    assert png.stat().st_size > 10_000  # seed 12: the pair's domain, with its counterfactual
    assert sr.draw_seesaw({"adaptive": {"11": run("q", [])}}, tmp_path / "t.png") == []
    assert not (tmp_path / "t.png").exists()


def test_parse_smoke_is_small() -> None:
    a: argparse.Namespace = sr.parse(["--smoke"])
    assert (a.seeds, a.steps, a.prompts) == ("dev", 2, 2) and len(a.domains) == 3


def test_pair_study_smoke(tmp_path) -> None:
    """benchmarks/scheduler_pair.py: 2 real steps of each arm; the one-sided arms train only
    their domain (the partner's share is 0) and both domains are evaluated; redraw re-reads."""
    import scheduler_pair as sp

    out, png, runs = tmp_path / "p.json", tmp_path / "p.png", tmp_path / "runs"
    args = ["--steps", "2", "--eval-every", "1", "--eval-n", "4", "--wandb", "disabled"]
    args += ["--out", str(out), "--png", str(png), "--run-dir", str(runs)]
    assert sp.main(args) == 0
    doc = json.loads(out.read_text())
    assert set(doc["results"]) == set(sp.ARMS) and png.stat().st_size > 10_000
    for r in doc["results"].values():
        assert sorted(r["final"]) == sorted(sp.PAIR)
    rows = [json.loads(x) for x in (runs / "train_add_only-s1" / "metrics.jsonl").open()]
    assert {r["sched/tinymix/add_last_digit/weight"] for r in rows if "loss/total" in r} == {0.0}
    assert sp.main([*args, "--redraw"]) == 0
